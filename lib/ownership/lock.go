package ownership

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// DefaultLockWait bounds Acquire when its context has no deadline.
const DefaultLockWait = 30 * time.Second

// lockPoll is how often Acquire retries a busy lock. Polling with LOCK_NB
// instead of a blocking flock keeps the wait abandonable without leaving a
// goroutine stuck in the kernel.
const lockPoll = 50 * time.Millisecond

// maxHolderSize bounds what is read back from the lock file.
const maxHolderSize = 4 << 10

// ErrLockTimeout is returned (wrapped, as *LockTimeoutError) when the
// installation lock stayed busy until the context ended. Begin maps it to
// exitcode.Defer: another stage owns the host for now.
var ErrLockTimeout = errors.New("installation lock busy")

// Holder says who holds the installation lock; the holder writes it into the
// lock file so that a waiter can tell the operator.
type Holder struct {
	Stage     string    `json:"stage"`               // binary name, e.g. kubeslot-repaver
	PID       int       `json:"pid"`                 // set by Acquire
	Since     time.Time `json:"since"`               // set by Acquire
	InstallID string    `json:"installID,omitempty"` // once known
}

func (h Holder) describe() string {
	s := fmt.Sprintf("%s (pid %d", h.Stage, h.PID)
	if h.InstallID != "" {
		s += ", installation " + h.InstallID
	}
	return s + ")"
}

// LockTimeoutError reports a lock that stayed busy, and who held it.
type LockTimeoutError struct {
	Path   string        // local path of the lock file
	Holder *Holder       // nil if the lock file did not say
	Raw    string        // lock file content when it was not a Holder
	Waited time.Duration // how long Acquire tried
	Cause  error         // the context's error
	now    time.Time     // when the error was made, for "for how long"
}

func (e *LockTimeoutError) Error() string {
	var who string
	switch {
	case e.Holder != nil && e.Holder.Since.IsZero():
		who = "held by " + e.Holder.describe()
	case e.Holder != nil:
		who = fmt.Sprintf("held by %s since %s (for %s)", e.Holder.describe(),
			e.Holder.Since.UTC().Format(time.RFC3339), roundDuration(e.now.Sub(e.Holder.Since)))
	case e.Raw != "":
		who = fmt.Sprintf("held by a process that wrote %q", e.Raw)
	default:
		who = "held by a process that has not written who it is (lock file empty)"
	}
	s := fmt.Sprintf("installation lock %s %s: gave up after %s", e.Path, who, roundDuration(e.Waited))
	if e.Cause != nil && !errors.Is(e.Cause, context.DeadlineExceeded) {
		s += " (" + e.Cause.Error() + ")"
	}
	return s
}

// Is makes errors.Is(err, ErrLockTimeout) true.
func (e *LockTimeoutError) Is(target error) bool { return target == ErrLockTimeout }

func (e *LockTimeoutError) Unwrap() error { return e.Cause }

func roundDuration(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(100 * time.Millisecond)
}

// Lock is a held installation lock.
type Lock struct {
	path   string
	f      *os.File
	holder Holder
}

// Acquire takes the installation lock (flock LOCK_EX on /run/kubeslot/
// install.lock, created if missing) and writes h into it, with PID and Since
// filled in. It retries until ctx ends (DefaultLockWait if ctx has no
// deadline) and then returns a *LockTimeoutError naming the holder.
//
// The lock belongs to the open file description, not to the process: a
// second Acquire in the same process opens the file again and waits like any
// other process would (tests rely on that). The kernel drops the lock when
// the holder exits, however it exits, so a crashed stage never blocks the
// next one. log may be nil.
func Acquire(ctx context.Context, root *hostroot.Root, h Holder, log *slog.Logger) (*Lock, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if h.Stage == "" {
		return nil, errors.New("acquire installation lock: holder stage must be set")
	}
	p, err := root.Lock()
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultLockWait)
		defer cancel()
	}
	if err := ensureDir(filepath.Dir(p)); err != nil {
		return nil, fmt.Errorf("acquire installation lock: %w", err)
	}
	// No-follow: a link planted in place of the lock file would otherwise
	// have kubeslot truncate and chmod whatever it points at.
	f, err := hostroot.OpenRegularFlags(p, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("acquire installation lock: open %s: %w", p, err)
	}
	// Readable by all, whatever the umask: waiters and kubeslot status read
	// who holds it.
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return nil, fmt.Errorf("acquire installation lock: chmod %s: %w", p, err)
	}
	start := time.Now()
	tick := time.NewTicker(lockPoll)
	defer tick.Stop()
	for waiting := false; ; waiting = true {
		err := flock(f, syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("acquire installation lock: flock %s: %w", p, err)
		}
		if !waiting {
			holder, raw := readHolder(p)
			who := raw
			if holder != nil {
				who = holder.describe()
			}
			log.Info("waiting for the installation lock", "path", p, "holder", who)
		}
		select {
		case <-ctx.Done():
			f.Close()
			e := &LockTimeoutError{Path: p, Waited: time.Since(start), Cause: ctx.Err(), now: time.Now()}
			e.Holder, e.Raw = readHolder(p)
			return nil, e
		case <-tick.C:
		}
	}
	l := &Lock{path: p, f: f, holder: h}
	l.holder.PID = os.Getpid()
	l.holder.Since = time.Now().UTC().Round(0)
	if err := l.writeHolder(); err != nil {
		l.Release()
		return nil, err
	}
	log.Debug("installation lock acquired", "path", p, "waited", time.Since(start))
	return l, nil
}

// Path is the local path of the lock file.
func (l *Lock) Path() string { return l.path }

// Holder is what this lock wrote into the lock file.
func (l *Lock) Holder() Holder { return l.holder }

// SetInstallID adds the install ID to the holder information once the
// record has been read (which needs the lock first).
func (l *Lock) SetInstallID(id string) error {
	if l.f == nil {
		return fmt.Errorf("installation lock %s: not held", l.path)
	}
	l.holder.InstallID = id
	return l.writeHolder()
}

func (l *Lock) writeHolder() error {
	b, err := json.Marshal(l.holder)
	if err != nil {
		return fmt.Errorf("installation lock %s: %w", l.path, err)
	}
	// No fsync: /run is volatile and the content is only a hint for waiters.
	if err := l.f.Truncate(0); err != nil {
		return fmt.Errorf("installation lock %s: write holder: %w", l.path, err)
	}
	if _, err := l.f.WriteAt(append(b, '\n'), 0); err != nil {
		return fmt.Errorf("installation lock %s: write holder: %w", l.path, err)
	}
	return nil
}

// Yield lets other stages have the lock while wait runs, then takes it back,
// waiting until ctx ends (DefaultLockWait if it has no deadline). For a
// holder that waits on another process which needs the lock first (the
// reset, waiting for a watcher that starts up under it). On an error the
// lock is not held, and a second Release does nothing.
func (l *Lock) Yield(ctx context.Context, wait func()) error {
	if l.f == nil {
		return fmt.Errorf("installation lock %s: not held", l.path)
	}
	if err := l.f.Truncate(0); err != nil {
		return fmt.Errorf("installation lock %s: %w", l.path, err)
	}
	if err := flock(l.f, syscall.LOCK_UN); err != nil {
		return fmt.Errorf("installation lock %s: unlock: %w", l.path, err)
	}
	wait()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultLockWait)
		defer cancel()
	}
	tick := time.NewTicker(lockPoll)
	defer tick.Stop()
	start := time.Now()
	for {
		err := flock(l.f, syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			l.f.Close()
			l.f = nil
			return fmt.Errorf("installation lock %s: take it back: %w", l.path, err)
		}
		select {
		case <-ctx.Done():
			e := &LockTimeoutError{Path: l.path, Waited: time.Since(start), Cause: ctx.Err(), now: time.Now()}
			e.Holder, e.Raw = readHolder(l.path)
			l.f.Close()
			l.f = nil
			return e
		case <-tick.C:
		}
	}
	l.holder.Since = time.Now().UTC().Round(0)
	return l.writeHolder()
}

// Release clears the holder information, unlocks and closes. The file stays:
// deleting a flock file races with a waiter that has it open. Release on a
// released lock does nothing.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	// Clear while still holding, so the next holder's words are never lost.
	errT := l.f.Truncate(0)
	errU := flock(l.f, syscall.LOCK_UN)
	errC := l.f.Close()
	l.f = nil
	if err := errors.Join(errT, errU, errC); err != nil {
		return fmt.Errorf("release installation lock %s: %w", l.path, err)
	}
	return nil
}

// ensureDir creates the lock directory 0755 whatever the umask; an existing
// one is left as it is.
func ensureDir(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create directory %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return fmt.Errorf("chmod %s: %w", dir, err)
	}
	return nil
}

func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// readHolder reads who holds the lock. It runs only while someone else holds
// it; a stale text left by a crashed holder is overwritten by the next one.
func readHolder(p string) (*Holder, string) {
	f, err := hostroot.OpenRegular(p)
	if err != nil {
		return nil, ""
	}
	defer f.Close()
	b, _ := io.ReadAll(io.LimitReader(f, maxHolderSize))
	raw := strings.TrimSpace(string(b))
	if raw == "" {
		return nil, ""
	}
	var h Holder
	if err := json.Unmarshal([]byte(raw), &h); err != nil || h.Stage == "" {
		return nil, raw
	}
	return &h, ""
}
