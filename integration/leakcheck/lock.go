package leakcheck

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// The machine lock keeps a leak check from seeing another test binary's work: `go test ./a ./b` runs packages as
// separate processes at the same time. Anything that changes the machine for a while (a host, a control plane)
// holds Share; a test that compares snapshots holds Exclusive from its first Take to its last.
//
// The lock belongs to the process (flock on one file description): inside one process, Share and Exclusive never
// wait for each other, because the tests of one binary run one after another unless they call t.Parallel. A test
// that compares snapshots must therefore not run in parallel with other rig tests of its own binary.
type procLock struct {
	path      string // the lock file; "" means LockPath()
	mu        sync.Mutex
	f         *os.File
	shared    int
	exclusive int
	held      int // what the process holds now: 0, syscall.LOCK_SH or syscall.LOCK_EX
}

var machineLock procLock

// LockPath is the lock file: $KUBESLOT_RIG_LOCK, or kubeslot-rig.lock in os.TempDir().
func LockPath() string {
	if p := os.Getenv("KUBESLOT_RIG_LOCK"); p != "" {
		return p
	}
	return filepath.Join(os.TempDir(), "kubeslot-rig.lock")
}

// Share declares that the caller changes the machine until release is called; it waits while another process
// holds Exclusive.
func Share(ctx context.Context) (release func(), err error) {
	return machineLock.take(ctx, &machineLock.shared)
}

// Exclusive waits until no other process holds Share or Exclusive, and keeps them out until release is called.
func Exclusive(ctx context.Context) (release func(), err error) {
	return machineLock.take(ctx, &machineLock.exclusive)
}

func (l *procLock) take(ctx context.Context, counter *int) (func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	*counter++
	if err := l.apply(ctx); err != nil {
		*counter--
		_ = l.apply(context.Background())
		return nil, err
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			*counter--
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			_ = l.apply(ctx) // a downgrade to shared that cannot be had leaves the lock released: harmless
		})
	}, nil
}

// apply makes the flock match the counters. Conversions are not atomic (flock drops the old lock first), so two
// processes upgrading at once cannot deadlock. Polling with LOCK_NB keeps every wait bounded by ctx.
func (l *procLock) apply(ctx context.Context) error {
	want := 0
	switch {
	case l.exclusive > 0:
		want = syscall.LOCK_EX
	case l.shared > 0:
		want = syscall.LOCK_SH
	}
	if want == l.held {
		return nil
	}
	if l.f == nil {
		if l.path == "" {
			l.path = LockPath()
		}
		f, err := os.OpenFile(l.path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return fmt.Errorf("leakcheck: machine lock: %w", err)
		}
		l.f = f
	}
	if want == 0 {
		l.held = 0
		return syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
	}
	t0 := time.Now()
	for {
		err := syscall.Flock(int(l.f.Fd()), want|syscall.LOCK_NB)
		if err == nil {
			l.held = want
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("leakcheck: flock %s: %w", l.path, err)
		}
		select {
		case <-ctx.Done():
			// A failed conversion may have dropped what we held: say so by the state we record.
			l.held = -1
			return fmt.Errorf("leakcheck: machine lock %s still held by another process after %v: %w",
				l.path, time.Since(t0).Round(time.Millisecond), ctx.Err())
		case <-time.After(25 * time.Millisecond):
		}
	}
}
