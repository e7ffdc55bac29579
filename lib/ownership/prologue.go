package ownership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// Prologue is how every stage that mutates the host starts: the
// installation lock, bounded (busy → exit 69), then the ownership record
// read under it, then the stage's own admission rule. Begin runs it; what
// differs between stages is only in these fields.
type Prologue struct {
	// Stage is the holder name written into the lock (its binary's name).
	Stage string
	// Wait bounds the lock wait; zero is DefaultLockWait.
	Wait time.Duration
	// WaitName names Wait in the deferral, as the operator sets it
	// ("timeouts.lock" adds " (timeouts.lock 30s)"); "" adds nothing.
	WaitName string
	// Admit decides, under the lock, from what Load returned, whether the
	// stage may run, and returns the record it works from: the one loaded,
	// one it made (a fresh installation's, a forced reset's salvage), or nil
	// (nothing owns the host). Its error is returned as it is. nil admits
	// whatever Load returned, its error included.
	Admit func(rec *Record, err error) (*Record, error)
	// Log gets the lock's waiting line and a failed release; nil discards.
	Log *slog.Logger
}

// Held is a stage's hold on the host after Begin: the lock, and the record
// it admitted (nil when none).
type Held struct {
	// Lock is the installation lock; nil once released.
	Lock   *Lock
	Record *Record
	p      Prologue
	root   *hostroot.Root
}

// Begin runs the prologue p. On success the lock is held, and names the
// record's installation when there is one; the caller ends with Release. On
// an error nothing is held.
func Begin(ctx context.Context, root *hostroot.Root, p Prologue) (*Held, error) {
	if p.Log == nil {
		p.Log = slog.New(slog.DiscardHandler)
	}
	h := &Held{p: p, root: root}
	if err := h.take(ctx); err != nil {
		return nil, err
	}
	rec, err := Load(root)
	if p.Admit != nil {
		rec, err = p.Admit(rec, err)
	}
	if err != nil {
		h.Release()
		return nil, err
	}
	h.Record = rec
	h.nameInstallation()
	return h, nil
}

// RequireComplete is the admission of the stages that only work on a
// complete installation (repaver, upgrader): anything less defers (69),
// saying why with incomplete.
func RequireComplete(incomplete string) func(*Record, error) (*Record, error) {
	return func(rec *Record, err error) (*Record, error) {
		if err == nil && (rec == nil || rec.Checkpoint != CheckpointComplete) {
			err = exitcode.Defer(errors.New(incomplete))
		}
		return rec, err
	}
}

// take acquires the lock within the prologue's bound; a busy lock is a
// deferral, so that the stage's unit is not failed for waiting its turn.
func (h *Held) take(ctx context.Context) error {
	wait := h.p.Wait
	if wait <= 0 {
		wait = DefaultLockWait
	}
	lctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	l, err := Acquire(lctx, h.root, Holder{Stage: h.p.Stage}, h.p.Log)
	switch {
	case errors.Is(err, ErrLockTimeout) && h.p.WaitName != "":
		return exitcode.Defer(fmt.Errorf("%w (%s %s)", err, h.p.WaitName, wait))
	case errors.Is(err, ErrLockTimeout):
		return exitcode.Defer(err)
	case err != nil:
		return err
	}
	h.Lock = l
	return nil
}

// nameInstallation writes the install ID into the lock for waiters; only a
// hint, so a failure is logged.
func (h *Held) nameInstallation() {
	if h.Record == nil {
		return
	}
	if err := h.Lock.SetInstallID(h.Record.InstallID); err != nil {
		h.p.Log.Warn("could not name the installation in the lock", "err", err)
	}
}

// Release lets go of the lock; a second Release does nothing. A failure is
// only logged: the kernel drops the lock when the process exits anyway.
func (h *Held) Release() {
	if h == nil || h.Lock == nil {
		return
	}
	if err := h.Lock.Release(); err != nil {
		h.p.Log.Warn("release the installation lock", "err", err)
	}
	h.Lock = nil
}

// Retake takes the lock again after Release, as Begin took it (busy →
// deferral), for a stage that lets other stages run in between (the
// upgrader, while the watcher it restarted starts up). The record is not
// read again: nothing else changes it while it is being worked on. A held
// lock is kept as it is.
func (h *Held) Retake(ctx context.Context) error {
	if h.Lock != nil {
		return nil
	}
	if err := h.take(ctx); err != nil {
		return err
	}
	h.nameInstallation()
	return nil
}
