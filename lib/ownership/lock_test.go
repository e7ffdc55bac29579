package ownership

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

// helperEnv carries the root prefix to the lock-holding child process.
const helperEnv = "KUBESLOT_OWNERSHIP_LOCK_HOLDER_PREFIX"

const childInstallID = "00112233445566778899aabbccddeeff"

// TestHelperLockHolder is not a test: it is the child process of
// TestLockHeldByChildProcess. It takes the lock under the prefix it is
// given, says "locked" and sleeps until it is killed.
func TestHelperLockHolder(t *testing.T) {
	prefix := os.Getenv(helperEnv)
	if prefix == "" {
		t.Skip("helper process for TestLockHeldByChildProcess")
	}
	root := testkit.RootAt(t, prefix)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := Acquire(ctx, root, Holder{Stage: "kubeslot-repaver", InstallID: childInstallID}, nil)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("locked")
	// Killed long before; bounded so that an orphan still goes away.
	time.Sleep(2 * time.Minute)
	l.Release()
}

func acquireWithin(t *testing.T, root *hostroot.Root, stage string, d time.Duration) (*Lock, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	l, err := Acquire(ctx, root, Holder{Stage: stage}, nil)
	t.Logf("Acquire(%s) took %v", stage, time.Since(start))
	return l, err
}

func TestLockHeldByChildProcess(t *testing.T) {
	t.Parallel()
	root := testkit.Root(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperLockHolder$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+root.Prefix())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := false
	t.Cleanup(func() {
		if !waited {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	ready := time.NewTimer(2 * time.Minute) // a bound, not a timing assertion
	defer ready.Stop()
	for locked := false; !locked; {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("child exited before it locked; stderr:\n%s", stderr.String())
			}
			locked = line == "locked"
		case <-ready.C:
			t.Fatalf("child did not lock; stderr:\n%s", stderr.String())
		}
	}
	pid := cmd.Process.Pid

	_, err = acquireWithin(t, root, "kubeslot-bootstrap", 500*time.Millisecond)
	if err == nil {
		t.Fatal("Acquire succeeded while the child holds the lock")
	}
	t.Logf("error: %v", err)
	if !errors.Is(err, ErrLockTimeout) {
		t.Errorf("error is not ErrLockTimeout: %v", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error does not carry the context's error: %v", err)
	}
	if got := exitcode.Of(exitcode.Defer(err)); got != exitcode.Deferred {
		t.Errorf("exit code %d, want %d", got, exitcode.Deferred)
	}
	lockPath, _ := root.Lock()
	for _, want := range []string{lockPath, "held by kubeslot-repaver", fmt.Sprintf("(pid %d,", pid), childInstallID, " since ", "gave up after "} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	var lte *LockTimeoutError
	if !errors.As(err, &lte) || lte.Holder == nil || lte.Holder.PID != pid || lte.Holder.Stage != "kubeslot-repaver" {
		t.Errorf("LockTimeoutError holder = %+v, want kubeslot-repaver pid %d", lte, pid)
	}

	// A crash: no Release, no clean-up. The kernel frees the lock.
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitErr := cmd.Wait()
	waited = true
	t.Logf("child: %v", waitErr)

	l, err := acquireWithin(t, root, "kubeslot-bootstrap", 30*time.Second)
	if err != nil {
		t.Fatalf("Acquire after the holder was killed: %v", err)
	}
	defer l.Release()
	h := readLockFile(t, root)
	if h.Stage != "kubeslot-bootstrap" || h.PID != os.Getpid() || h.InstallID != "" {
		t.Errorf("lock file after takeover names %+v, want kubeslot-bootstrap pid %d without the dead holder's install ID", h, os.Getpid())
	}
}

func readLockFile(t *testing.T, root *hostroot.Root) Holder {
	t.Helper()
	p, err := root.Lock()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var h Holder
	if len(bytes.TrimSpace(b)) > 0 {
		if err := json.Unmarshal(b, &h); err != nil {
			t.Fatalf("lock file %s: %v: %q", p, err, b)
		}
	}
	return h
}

// Two Acquires in one process contend: each opens its own file description
// and flock locks belong to the description, not the process. The stages
// rely on this (and tests do, to hold the lock without a child).
func TestLockSameProcessContends(t *testing.T) {
	t.Parallel()
	root := testkit.Root(t)
	first, err := acquireWithin(t, root, "kubeslot-repaver", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_, err = acquireWithin(t, root, "kubeslot-bootstrap", 300*time.Millisecond)
	if !errors.Is(err, ErrLockTimeout) {
		t.Fatalf("second Acquire in the same process: %v, want ErrLockTimeout", err)
	}
	t.Logf("error: %v", err)
	if want := fmt.Sprintf("held by kubeslot-repaver (pid %d)", os.Getpid()); !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not contain %q", err, want)
	}
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	second, err := acquireWithin(t, root, "kubeslot-bootstrap", 5*time.Second)
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	if err := second.Release(); err != nil {
		t.Fatal(err)
	}
}

// A waiter is let in when the holder releases while it waits.
func TestLockWaiterGetsReleasedLock(t *testing.T) {
	t.Parallel()
	root := testkit.Root(t)
	first, err := acquireWithin(t, root, "kubeslot-repaver", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		l, err := Acquire(ctx, root, Holder{Stage: "kubeslot-bootstrap"}, nil)
		if err == nil {
			err = l.Release()
		}
		got <- err
	}()
	time.Sleep(200 * time.Millisecond) // let it find the lock busy; not asserted
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Errorf("waiter: %v", err)
	}
}

func TestLockFileContent(t *testing.T) {
	t.Parallel()
	root := testkit.Root(t)
	l, err := acquireWithin(t, root, "kubeslot-bootstrap", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := root.Lock()
	if l.Path() != p || filepath.Base(p) != hostroot.LockName {
		t.Errorf("lock path %s, want %s", l.Path(), p)
	}
	for _, c := range []struct {
		path string
		mode os.FileMode
	}{{filepath.Dir(p), 0o755}, {p, 0o644}} {
		fi, err := os.Stat(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != c.mode {
			t.Errorf("%s: mode %v, want %v", c.path, fi.Mode().Perm(), c.mode)
		}
	}
	h := readLockFile(t, root)
	if h.Stage != "kubeslot-bootstrap" || h.PID != os.Getpid() || h.Since.IsZero() || !h.Since.Equal(l.Holder().Since) {
		t.Errorf("lock file says %+v; lock says %+v", h, l.Holder())
	}
	if err := l.SetInstallID(childInstallID); err != nil {
		t.Fatal(err)
	}
	if h := readLockFile(t, root); h.InstallID != childInstallID || h.Stage != "kubeslot-bootstrap" {
		t.Errorf("after SetInstallID the lock file says %+v", h)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(p); err != nil || len(b) != 0 {
		t.Errorf("after Release the lock file holds %q (%v), want it empty and present", b, err)
	}
	if err := l.Release(); err != nil {
		t.Errorf("second Release: %v", err)
	}
	if err := l.SetInstallID("x"); err == nil {
		t.Error("SetInstallID on a released lock succeeded")
	}
	if _, err := Acquire(context.Background(), root, Holder{}, nil); err == nil {
		t.Error("Acquire without a stage succeeded")
	}
}

// A holder that wrote nothing readable is still reported, not hidden.
func TestLockTimeoutUnknownHolder(t *testing.T) {
	t.Parallel()
	root := testkit.Root(t)
	p, _ := root.Lock()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ content, want string }{
		{"", "lock file empty"},
		{"stage=old-tool pid=7\n", `wrote "stage=old-tool pid=7"`},
	} {
		if err := os.WriteFile(p, []byte(tc.content), 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			t.Fatal(err)
		}
		_, err = acquireWithin(t, root, "kubeslot-bootstrap", 200*time.Millisecond)
		f.Close()
		if !errors.Is(err, ErrLockTimeout) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("content %q: error %v, want ErrLockTimeout containing %q", tc.content, err, tc.want)
		}
	}
}

// A cancelled wait (the stage is being stopped) says so.
func TestLockCancelled(t *testing.T) {
	t.Parallel()
	root := testkit.Root(t)
	first, err := acquireWithin(t, root, "kubeslot-repaver", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Release()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	go func() {
		time.Sleep(100 * time.Millisecond)
		cancel()
	}()
	_, err = Acquire(ctx, root, Holder{Stage: "kubeslot-bootstrap"}, nil)
	if !errors.Is(err, ErrLockTimeout) || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "context canceled") {
		t.Errorf("cancelled Acquire: %v", err)
	}
}

// A link planted in place of the lock file is not followed: the file it
// points at is neither truncated nor chmod'd.
func TestLockFileLinkNotFollowed(t *testing.T) {
	t.Parallel()
	root := testkit.Root(t)
	// Under the prefix "/" a link to /etc/shadow names the host's own.
	victim := filepath.Join(root.Prefix(), "etc", "shadow")
	os.MkdirAll(filepath.Dir(victim), 0o755)
	if err := os.WriteFile(victim, []byte("root:secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, _ := root.Lock()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/shadow", p); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l, err := Acquire(ctx, root, Holder{Stage: "test"}, nil)
	if err == nil {
		l.Release()
		t.Fatal("lock taken through a symbolic link")
	}
	if !errors.Is(err, hostroot.ErrNotRegular) {
		t.Errorf("error %v, want one saying the lock file is not a regular file", err)
	}
	fi, _ := os.Stat(victim)
	if b, _ := os.ReadFile(victim); string(b) != "root:secret\n" || fi.Mode().Perm() != 0o600 {
		t.Errorf("the link's target was changed: %q mode %v", b, fi.Mode())
	}
	// A FIFO in its place is refused too, at once.
	os.Remove(p)
	if err := syscall.Mkfifo(p, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Acquire(ctx, root, Holder{Stage: "test"}, nil); !errors.Is(err, hostroot.ErrNotRegular) {
		t.Errorf("FIFO lock file: %v", err)
	}
}

// Yield lets a waiter in while it waits, then takes the lock back once the
// waiter released it, and holds it afterwards.
func TestLockYield(t *testing.T) {
	t.Parallel()
	root := testkit.Root(t)
	held, err := acquireWithin(t, root, "kubeslot-resetter", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var inner error
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = held.Yield(ctx, func() {
		var l *Lock
		if l, inner = acquireWithin(t, root, "kubeslot-watcher", 2*time.Second); inner == nil {
			inner = l.Release()
		}
	})
	if err != nil || inner != nil {
		t.Fatalf("yield: %v; the waiter while yielded: %v", err, inner)
	}
	if _, err := acquireWithin(t, root, "kubeslot-watcher", 200*time.Millisecond); !errors.Is(err, ErrLockTimeout) {
		t.Errorf("after Yield the lock is not held again: %v", err)
	}
	if b, _ := os.ReadFile(held.Path()); !strings.Contains(string(b), "kubeslot-resetter") {
		t.Errorf("lock file after Yield: %q", b)
	}
	// Taking it back is bounded: a holder that keeps it makes Yield fail.
	var other *Lock
	short, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	err = held.Yield(short, func() { other, _ = acquireWithin(t, root, "kubeslot-watcher", 2*time.Second) })
	if !errors.Is(err, ErrLockTimeout) || other == nil {
		t.Errorf("yield while another keeps the lock: %v", err)
	}
	if err := held.Release(); err != nil {
		t.Errorf("release after a failed Yield: %v", err)
	}
	other.Release()
}
