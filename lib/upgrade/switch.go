package upgrade

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/kubeslot/kubeslot/lib/bundle"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/release"
	"github.com/kubeslot/kubeslot/lib/unitinstall"
	"github.com/kubeslot/kubeslot/units"
)

// switchAndGate points current at the new release, then goes on after the
// switch.
func (t *txn) switchAndGate(ctx context.Context) (*Result, error) {
	err := t.step(ctx, Switch, func() error {
		t.sig.SwitchedAt = t.d.now().UTC()
		if err := t.writeSignal(); err != nil {
			return err
		}
		return release.SetCurrent(t.d.Root, t.sig.ToRelease)
	})
	if err != nil {
		if isInterrupted(ctx, err) {
			return nil, err
		}
		// current may or may not have moved: roll back, which is a no-op
		// for a link that did not.
		return t.rollback(ctx, fmt.Sprintf("switching to %s failed: %v", t.sig.ToRelease, err))
	}
	return t.afterSwitch(ctx)
}

// afterSwitch installs the new release's units, restarts the watcher and
// gates on its health; current names the new release.
func (t *txn) afterSwitch(ctx context.Context) (*Result, error) {
	d, s := t.d, t.sig
	if s.SwitchedAt.IsZero() {
		s.SwitchedAt = d.now().UTC()
	}
	toDir, err := release.Dir(d.Root, s.ToRelease)
	if err != nil {
		return nil, err
	}
	err = t.step(ctx, Units, func() error {
		if err := installReleaseUnits(ctx, d, t.rec, toDir, t.log); err != nil {
			return err
		}
		return t.writeSignal()
	})
	if err != nil {
		if isInterrupted(ctx, err) {
			return nil, err
		}
		return t.rollback(ctx, fmt.Sprintf("installing the unit files of %s failed: %v", s.ToVersion, err))
	}
	// The new watcher takes the installation lock when it starts.
	t.release()
	var unhealthy, before string
	err = t.step(ctx, Restart, func() error {
		// The invocation before the restart: the gate judges only later ones.
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		st, err := d.Systemd.Unit(cctx, WatcherUnit)
		cancel()
		if err == nil {
			before = st.InvocationID
		}
		// A unit that hit its start limit (a crash loop before) refuses a
		// restart until its failed state is reset.
		if err := d.Systemd.ResetFailed(ctx, WatcherUnit); err != nil {
			t.log.Warn("reset-failed of the watcher", "err", err)
		}
		return restartWatcher(ctx, d)
	})
	if err != nil && !isInterrupted(ctx, err) {
		unhealthy = fmt.Sprintf("could not be restarted: %v", err)
	}
	if err == nil {
		err = t.step(ctx, Health, func() error {
			why, err := gate(ctx, d, toDir, before, t.j.HealthWindow, t.j.HealthTimeout)
			if err != nil {
				return err
			}
			unhealthy = why
			if why == "" {
				t.res.Healthy = d.now().Sub(s.SwitchedAt)
			}
			return nil
		})
	}
	if err != nil && isInterrupted(ctx, err) {
		return nil, err
	}
	if unhealthy != "" {
		return t.rollback(ctx, fmt.Sprintf("new watcher %s %s; rolled back to %s", s.ToVersion, unhealthy, s.FromVersion))
	}
	if err != nil {
		return t.rollback(ctx, fmt.Sprintf("new watcher %s: health gate: %v; rolled back to %s", s.ToVersion, err, s.FromVersion))
	}
	// Healthy: take the lock again to record it and finish the request.
	if err := t.relock(ctx); err != nil {
		return nil, fmt.Errorf("the new watcher %s is healthy, but recording it needs the installation lock: %w", s.ToVersion, err)
	}
	cur, err := d.Requests.ReadUpgradeSignal()
	if err != nil {
		return nil, err
	}
	switch {
	case cur == nil || cur.RequestID != s.RequestID:
		t.log.Info("the new watcher already reported the upgrade")
	case cur.Failure != "":
		// The recovery unit rolled back meanwhile.
		t.lockedFinish()
		t.res.Outcome, t.res.Message = RolledBack, cur.Failure
		return &t.res, fmt.Errorf("%w: %s", ErrRolledBack, cur.Failure)
	default:
		// This run's phases already hold the signal's (resume) and the
		// recovery unit does not add any.
		t.sig = cur
		t.sig.Verified = true
		if err := t.writeSignal(); err != nil {
			return nil, err
		}
	}
	t.lockedFinish()
	t.res.Outcome = Upgraded
	t.res.Message = fmt.Sprintf("upgraded %s -> %s; the new watcher is healthy", s.FromVersion, s.ToVersion)
	return &t.res, nil
}

// rollback points current back at the release the upgrade came from,
// reinstalls its units, records reason in the signal (unless a failure is
// already there), finishes the request and restarts the old watcher.
func (t *txn) rollback(ctx context.Context, reason string) (*Result, error) {
	d, s := t.d, t.sig
	t.log.Error("upgrade failed after the switch; rolling back", "reason", reason)
	// The rollback must finish even when the run was told to stop.
	ctx = context.WithoutCancel(ctx)
	if err := t.relock(ctx); err != nil {
		return nil, fmt.Errorf("roll back (%s): %w", reason, err)
	}
	var rbErr error
	var fromDir string
	_ = t.step(ctx, Rollback, func() error {
		var err error
		if fromDir, err = release.Dir(d.Root, s.FromRelease); err != nil {
			rbErr = err
			return err
		}
		if err := release.SetCurrent(d.Root, s.FromRelease); err != nil {
			rbErr = err
			return err
		}
		if err := installReleaseUnits(ctx, d, t.rec, fromDir, t.log); err != nil {
			// current is back; the unit files are what a later run repairs.
			t.log.Error("reinstalling the old release's unit files failed", "err", err)
		}
		return nil
	})
	if rbErr != nil {
		return nil, fmt.Errorf("roll back (%s): %w", reason, rbErr)
	}
	cur, err := d.Requests.ReadUpgradeSignal()
	if err != nil {
		return nil, err
	}
	if cur != nil && cur.RequestID == s.RequestID {
		t.sig = cur // a failure the recovery unit recorded is kept
	}
	if t.sig.Failure == "" {
		t.sig.Failure = bounded(reason)
	}
	t.sig.Verified = false
	if err := t.writeSignal(); err != nil {
		return nil, err
	}
	t.lockedFinish()
	t.release() // the old watcher takes the lock when it starts
	if err := d.Systemd.ResetFailed(ctx, WatcherUnit); err != nil {
		t.log.Warn("reset-failed of the watcher", "err", err)
	}
	if err := restartWatcher(ctx, d); err != nil {
		t.log.Error("restarting the old watcher failed", "err", err)
	} else if why, err := waitActive(ctx, d, fromDir, t.j.HealthTimeout); err != nil || why != "" {
		t.log.Error("the old watcher is not active after the rollback", "why", why, "err", err)
	} else if !s.SwitchedAt.IsZero() {
		t.res.RolledBack = d.now().Sub(s.SwitchedAt)
	}
	t.res.Outcome, t.res.Message = RolledBack, t.sig.Failure
	return &t.res, fmt.Errorf("%w: %s", ErrRolledBack, t.sig.Failure)
}

// installReleaseUnits installs the unit files of the release directory dir
// (its units/; a release without one gets this binary's embedded
// templates), journalled, and reloads systemd when something changed.
func installReleaseUnits(ctx context.Context, d *Deps, rec *ownership.Record, dir string, log *slog.Logger) error {
	rendered, err := releaseUnits(d, dir)
	if err != nil {
		return err
	}
	changed, err := unitinstall.Install(d.Root, rec, rendered)
	if err != nil {
		return err
	}
	if len(changed) == 0 {
		return nil
	}
	log.Info("unit files installed", "changed", changed)
	rctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	return d.Systemd.DaemonReload(rctx)
}

// releaseUnits renders the unit templates of release directory dir for
// this host root.
func releaseUnits(d *Deps, dir string) (map[string][]byte, error) {
	udir := filepath.Join(dir, bundle.UnitsDir)
	ents, err := os.ReadDir(udir)
	if errors.Is(err, fs.ErrNotExist) {
		return units.All(units.Vars{Base: d.Root.Base()})
	}
	if err != nil {
		return nil, err
	}
	tmpl := map[string][]byte{}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			return nil, fmt.Errorf("%s: %s is not a regular file", udir, e.Name())
		}
		b, err := os.ReadFile(filepath.Join(udir, e.Name()))
		if err != nil {
			return nil, err
		}
		tmpl[e.Name()] = b
	}
	return units.RenderFrom(tmpl, units.Vars{Base: d.Root.Base()})
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
// unit could not be read at all. States of invocation before (the one
// before the restart) are not held against the new watcher.
func gate(ctx context.Context, d *Deps, dir, before string, window, timeout time.Duration) (string, error) {
	return watch(ctx, d, dir, before, window, timeout, true)
}

// waitActive waits, within timeout, until the watcher is active and runs
// dir's binary (the rollback's check; no window).
func waitActive(ctx context.Context, d *Deps, dir string, timeout time.Duration) (string, error) {
	return watch(ctx, d, dir, "", 0, timeout, false)
}

func watch(ctx context.Context, d *Deps, dir, before string, window, timeout time.Duration, strict bool) (string, error) {
	want := filepath.Join(dir, "kubeslot-watcher")
	if p, err := filepath.EvalSymlinks(want); err == nil {
		want = p
	}
	deadline := d.now().Add(timeout)
	var (
		inv      string // the first invocation seen running want
		base     uint32 // its restart counter
		pid      uint32
		since    time.Time
		last     UnitStatus
		lastErr  error
		lastExe  string
		restarts uint32
	)
	for {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		st, err := d.Systemd.Unit(cctx, WatcherUnit)
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
				if err == nil && exe == want {
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
		case <-time.After(pollInterval):
		}
	}
}
