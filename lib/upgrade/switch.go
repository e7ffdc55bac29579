package upgrade

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/release"
	"github.com/kubeslot/kubeslot/lib/systemdconn"
	"github.com/kubeslot/kubeslot/lib/unitinstall"
)

// installReleaseUnits installs the unit files of the release directory dir
// (its units/; a release without one gets this binary's embedded
// templates), journalled; stops and removes the units kubeslot installed
// that this release does not have (a unit a newer release dropped, or one
// a rolled-back release added); and reloads systemd when something changed.
func installReleaseUnits(ctx context.Context, d *Deps, rec *ownership.Record, dir string, log *slog.Logger) error {
	rendered, err := releaseUnits(d, dir)
	if err != nil {
		return err
	}
	changed, err := unitinstall.Install(d.Root, rec, rendered)
	if err != nil {
		return err
	}
	dropped, err := unitinstall.Dropped(d.Root, rec, rendered)
	if err != nil {
		return err
	}
	for _, name := range dropped {
		// A template has no unit of its own to stop; its instances are the
		// workers', which end by themselves.
		if !strings.Contains(name, "@.") {
			sctx, cancel := context.WithTimeout(ctx, callTimeout)
			err := d.Systemd.StopUnit(sctx, name)
			cancel()
			if err != nil {
				return fmt.Errorf("stop %s, which %s does not have: %w", name, filepath.Base(dir), err)
			}
		}
		removed, err := unitinstall.Remove(d.Root, name)
		if err != nil {
			return err
		}
		changed = append(changed, removed...)
	}
	if len(changed) == 0 {
		return nil
	}
	log.Info("unit files installed", "changed", changed, "removed", dropped)
	rctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	return d.Systemd.Reload(rctx)
}

// releaseUnits renders the unit templates of release directory dir for
// this host root.
func releaseUnits(d *Deps, dir string) (map[string][]byte, error) {
	out, _, err := release.RenderUnits(d.Root, dir)
	return out, err
}

// handover is how the new release's watcher came to run, for the gate.
type handover struct {
	// reexeced: the running watcher re-executed the new binary itself; st
	// is the unit then, so every later restart or failure counts.
	reexeced bool
	st       systemdconn.ServiceStatus
	// before is the invocation restarted (restart path): its states are not
	// held against the new watcher.
	before string
}

// handOver gets the new release's watcher running. A watcher started
// through current re-executes the new binary in place when the link flips
// (same PID, no restart), which is all an upgrade needs when the watcher's
// unit file did not change. When it did (new settings take effect only on a
// start), or the watcher is not running, or it did not re-execute within
// the handover bound (a release from before re-exec), the unit is
// restarted.
func (t *txn) handOver(ctx context.Context, toDir string) (handover, error) {
	d := t.d
	changed, err := watcherUnitChanged(d, t.sig.FromRelease, toDir)
	if err != nil {
		t.log.Warn("compare the watcher unit files of the two releases; restarting the watcher", "err", err)
		changed = true
	}
	if !changed {
		st, ok, err := awaitReexec(ctx, d, toDir, t.j.HandoverTimeout)
		if err != nil {
			return handover{}, err
		}
		if ok {
			t.log.Info("the watcher re-executed the new release in place", "pid", st.MainPID)
			return handover{reexeced: true, st: st}, nil
		}
		t.log.Info("the watcher did not re-execute the new release; restarting its unit", "within", t.j.HandoverTimeout)
	} else {
		t.log.Info("the new release changes the watcher's unit file; restarting the watcher")
	}
	var h handover
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	st, err := d.Systemd.ServiceStatus(cctx, WatcherUnit)
	cancel()
	if err == nil {
		h.before = st.InvocationID
	}
	// A unit that hit its start limit (a crash loop before) refuses a
	// restart until its failed state is reset.
	if err := d.Systemd.ResetFailed(ctx, WatcherUnit); err != nil {
		t.log.Warn("reset-failed of the watcher", "err", err)
	}
	return h, restartWatcher(ctx, d)
}

// watcherUnitChanged reports whether the watcher's rendered unit file
// differs between release from and the release directory toDir.
func watcherUnitChanged(d *Deps, from, toDir string) (bool, error) {
	fromDir, err := release.Dir(d.Root, from)
	if err != nil {
		return true, err
	}
	a, err := releaseUnits(d, fromDir)
	if err != nil {
		return true, err
	}
	b, err := releaseUnits(d, toDir)
	if err != nil {
		return true, err
	}
	return !bytes.Equal(a[WatcherUnit], b[WatcherUnit]), nil
}

// awaitReexec waits, within timeout, until the running watcher runs dir's
// binary. It gives up at once when the watcher is not running: nothing
// would re-execute.
func awaitReexec(ctx context.Context, d *Deps, dir string, timeout time.Duration) (systemdconn.ServiceStatus, bool, error) {
	want := watcherBinary(dir)
	deadline := d.now().Add(timeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		st, err := d.Systemd.ServiceStatus(cctx, WatcherUnit)
		cancel()
		if err == nil {
			if st.ActiveState != "active" && st.ActiveState != "reloading" || st.MainPID == 0 {
				return st, false, nil
			}
			if exe, err := d.Exe(st.MainPID); err == nil && exe == want {
				return st, true, nil
			}
		}
		if d.now().After(deadline) {
			return st, false, nil
		}
		select {
		case <-ctx.Done():
			return st, false, &interrupted{context.Cause(ctx)}
		case <-d.poll():
		}
	}
}

// watcherBinary is dir's watcher binary, links resolved as /proc/PID/exe
// shows it.
func watcherBinary(dir string) string {
	want := filepath.Join(dir, "kubeslot-watcher")
	if p, err := filepath.EvalSymlinks(want); err == nil {
		return p
	}
	return want
}

// restartWatcher queues a restart of the watcher unit.
func restartWatcher(ctx context.Context, d *Deps) error {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	return d.Systemd.RestartUnit(cctx, WatcherUnit)
}

// gate waits until the watcher runs dir's binary and stays up for window,
// within timeout. It returns "" when healthy, else what went wrong ("exited",
// "was restarted 2 times", "not active within 45s"); an error only when the
// unit could not be read at all. After a restart, states of the invocation
// restarted are not held against the new watcher; after a re-exec, every
// failure and automatic restart since counts.
func gate(ctx context.Context, d *Deps, dir string, h handover, window, timeout time.Duration) (string, error) {
	if h.reexeced {
		return watch(ctx, d, dir, "", &h.st, window, timeout, true)
	}
	return watch(ctx, d, dir, h.before, nil, window, timeout, true)
}

// waitActive waits, within timeout, until the watcher is active and runs
// dir's binary (the rollback's check; no window).
func waitActive(ctx context.Context, d *Deps, dir string, timeout time.Duration) (string, error) {
	return watch(ctx, d, dir, "", nil, 0, timeout, false)
}

// watch is the gate (strict) and the rollback's wait. seen, when set, is the
// unit already running dir's binary: its invocation and restart counter
// are the baseline from the start.
func watch(ctx context.Context, d *Deps, dir, before string, seen *systemdconn.ServiceStatus, window, timeout time.Duration, strict bool) (string, error) {
	want := watcherBinary(dir)
	deadline := d.now().Add(timeout)
	var (
		inv      string // the first invocation seen running want
		base     uint32 // its restart counter
		pid      uint32
		since    time.Time
		last     systemdconn.ServiceStatus
		lastErr  error
		lastExe  string
		restarts uint32
	)
	if seen != nil {
		inv, base, pid, since = seen.InvocationID, seen.NRestarts, seen.MainPID, d.now()
	}
	for {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		st, err := d.Systemd.ServiceStatus(cctx, WatcherUnit)
		cancel()
		now := d.now()
		if err != nil {
			lastErr = err
		} else {
			last = st
			if strict && inv != "" {
				if st.InvocationID != inv {
					restarts++
				}
				if st.NRestarts > base {
					restarts = max(restarts, st.NRestarts-base)
				}
				if restarts > 0 {
					return fmt.Sprintf("was restarted %d times", restarts), nil
				}
			}
			if strict && st.InvocationID != before && (st.ActiveState == "failed" || st.SubState == "auto-restart") {
				return fmt.Sprintf("exited (unit %s/%s)", st.ActiveState, st.SubState), nil
			}
			if st.ActiveState == "active" && st.MainPID != 0 {
				exe, err := d.Exe(st.MainPID)
				lastExe = exe
				// The invocation being restarted may run want already (it
				// re-executed on the switch): only a later one counts.
				if err == nil && exe == want && (before == "" || st.InvocationID != before) {
					if inv == "" {
						inv, base = st.InvocationID, st.NRestarts
					}
					if st.MainPID != pid {
						pid, since = st.MainPID, now
					}
					if now.Sub(since) >= window {
						return "", nil
					}
				}
			}
		}
		if now.After(deadline) {
			if last.ActiveState == "" && lastErr != nil {
				return "", fmt.Errorf("read unit %s: %w", WatcherUnit, lastErr)
			}
			why := fmt.Sprintf("was not active within %s (unit %s/%s", timeout, last.ActiveState, last.SubState)
			if lastExe != "" && lastExe != want {
				why += ", running " + lastExe + " instead of " + want
			}
			return why + ")", nil
		}
		select {
		case <-ctx.Done():
			return "", &interrupted{context.Cause(ctx)}
		case <-d.poll():
		}
	}
}
