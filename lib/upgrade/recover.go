package upgrade

import (
	"context"
	"errors"
	"fmt"

	"github.com/kubeslot/kubeslot/lib/release"
	"github.com/kubeslot/kubeslot/lib/transition"
)

// Recover is `kubeslot-upgrader recover`, run by kubeslot-recovery.service
// (the watcher's OnFailure=) from the last-good release: when current does
// not name last-good, it points current back at it, reinstalls its unit
// files, records the failure in the pending-upgrade signal (when one is
// there without a failure) and, for a release already reported Succeeded,
// in its probation file, and resets and restarts the watcher. When current
// already is last-good there is nothing to roll back and it changes nothing:
// a watcher failing on a good release is for an administrator, and
// restarting it here would only make a loop. Idempotent: it runs on every
// failure of the watcher (its ExecStopPost= starts the recovery unit after
// each stop that is not clean; OnFailure= once the start limit is hit).
// Under the lock it runs the phase Recovery of the upgrade's table, alone.
func Recover(ctx context.Context, d *Deps, j Job) (*Result, error) {
	t, err := begin(ctx, d, j, "the installation is not complete: nothing to recover")
	if err != nil {
		return nil, err
	}
	defer t.release()
	tr := transition.Runner{Stage: "upgrade", Log: t.log, From: string(Recovery), Now: d.Now}
	if _, err := tr.Run(ctx, t.table()); err != nil {
		// The phase's own error, as the run returned it before it was a
		// phase: its message and exit code.
		if pe, ok := errors.AsType[*transition.PhaseError](err); ok && pe.Ran {
			return t.recovered, pe.Err
		}
		return t.recovered, err
	}
	return t.recovered, nil
}

// recover is the phase Recovery; what it did is in t.recovered.
func (t *txn) recover(ctx context.Context) error {
	res, err := t.recoverRun(ctx)
	t.recovered = res
	return err
}

func (t *txn) recoverRun(ctx context.Context) (*Result, error) {
	d := t.d
	cur, err := release.Current(d.Root)
	if err != nil {
		return nil, err
	}
	lg, err := release.LastGood(d.Root)
	if err != nil {
		d.Log.Warn("no last-good release: nothing to roll back to", "err", err)
		return &Result{Outcome: Nothing, Message: "no last-good release", Took: d.now().Sub(t.t0)}, nil
	}
	if cur == lg {
		d.Log.Warn("current is the last-good release: nothing to roll back; a watcher failing on it needs an administrator (journalctl -u kubeslot-watcher)",
			"release", cur)
		return &Result{Outcome: Nothing, FromRelease: cur, Message: "current is last-good (" + cur + "): nothing to roll back", Took: d.now().Sub(t.t0)}, nil
	}
	curDir, err := release.Dir(d.Root, cur)
	if err != nil {
		return nil, err
	}
	lgDir, err := release.Dir(d.Root, lg)
	if err != nil {
		return nil, err
	}
	lgVersion, err := releaseVersion(ctx, d, lgDir)
	if err != nil {
		return nil, fmt.Errorf("last-good release %s: %w: not switching to it", lg, err)
	}
	if err := smoke(ctx, d, lgDir, lgVersion); err != nil {
		return nil, fmt.Errorf("last-good release %s: %w: not switching to it", lg, err)
	}
	curVersion, err := releaseVersion(ctx, d, curDir)
	if err != nil {
		curVersion = "of release " + cur // broken: the reason we are here
	}
	res := &Result{Outcome: Recovered, FromRelease: cur, FromVersion: curVersion, ToRelease: lg, ToVersion: lgVersion}
	d.Log.Warn("the watcher kept failing: pointing current back at last-good", "from", cur, "to", lg)
	if err := release.SetCurrent(d.Root, lg); err != nil {
		return nil, err
	}
	if err := installReleaseUnits(ctx, d, t.rec, lgDir, d.Log); err != nil {
		// current is back, which is what matters; units are repaired by the
		// next run or the bootstrap's.
		d.Log.Error("reinstalling the last-good release's unit files failed", "err", err)
	}
	sig, err := d.Requests.ReadUpgradeSignal()
	if err != nil {
		d.Log.Error("could not read the pending-upgrade signal", "err", err)
	}
	if sig != nil && sig.Failure == "" {
		sig.Failure = bounded(fmt.Sprintf("the new watcher %s kept failing after the upgrade; recovered to %s", sig.ToVersion, lgVersion))
		sig.Verified = false
		if err := d.Requests.WriteUpgradeSignal(sig); err != nil {
			return nil, err
		}
	}
	if err := recordProbationRollback(d, cur, curVersion, lgVersion); err != nil {
		return nil, err
	}
	res.Message = fmt.Sprintf("current pointed back at %s (%s) from %s (%s)", lg, lgVersion, cur, curVersion)
	t.release() // the watcher takes the lock when it starts
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if err := d.Systemd.ResetFailed(cctx, WatcherUnit); err != nil {
		d.Log.Warn("reset-failed of the watcher", "err", err)
	}
	// A restart, not a start: a watcher of the failing release may be up
	// between two crashes, and the last-good one must run now.
	if err := d.Systemd.RestartUnit(cctx, WatcherUnit); err != nil {
		return res, fmt.Errorf("%s, but starting the watcher failed: %w", res.Message, err)
	}
	res.Took = d.now().Sub(t.t0)
	return res, nil
}

// recordProbationRollback records in the probation file that release cur,
// reported Succeeded and still on probation, was rolled back: the watcher
// of the release recovered to publishes it. Nothing when no probation names
// cur (the verdict was not given yet, or an older release's file).
func recordProbationRollback(d *Deps, cur, curVersion, lgVersion string) error {
	p, err := d.Requests.ReadProbation()
	if err != nil {
		d.Log.Error("could not read the upgrade probation file; the rollback after Succeeded is not recorded in it", "err", err)
		return nil
	}
	if p == nil || p.ToRelease != cur || p.Reason != "" {
		return nil
	}
	p.RolledBackAt = d.now().UTC()
	p.Reason = bounded(fmt.Sprintf("the watcher %s failed on probation (kubeslot-watcher.service entered failed); the recovery unit pointed current back at %s", curVersion, lgVersion))
	d.Log.Warn("the release was reported Succeeded and is rolled back while on probation", "request", p.RequestID, "release", cur, "version", curVersion)
	return d.Requests.WriteProbation(p)
}
