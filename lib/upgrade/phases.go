package upgrade

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/kubeslot/kubeslot/lib/artifact"
	"github.com/kubeslot/kubeslot/lib/bundle"
	"github.com/kubeslot/kubeslot/lib/release"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/transition"
)

// unhealthy is a health gate that ran and found the new watcher not
// healthy (why: "exited", "was restarted 2 times", ...).
type unhealthy struct{ why string }

func (u *unhealthy) Error() string { return u.why }

// table is the upgrade's phases in order (fresh runs them from preflight, a
// resume from smoke-test or units), then the rollback that a failure after
// the switch goes to.
func (t *txn) table() []transition.Phase {
	ph := func(p Phase, what string, run func(context.Context) error) transition.Phase {
		return transition.Phase{Name: string(p), What: what, Run: run}
	}
	// A failure after the switch records why and goes to the rollback.
	// current may or may not have moved when switch fails: the rollback is
	// a no-op for a link that did not.
	rollBack := func(p transition.Phase, why func(err error) string) transition.Phase {
		return p.FailingTo(string(Rollback), func(_ context.Context, err error) {
			t.reason = why(err)
			t.log.Error("upgrade failed after the switch; rolling back", "reason", t.reason)
		})
	}
	return []transition.Phase{
		ph(Preflight, "versions and releases", t.preflight),
		ph(Download, "fetch the bundle", t.download),
		ph(LastGood, "last-good names the running release", t.lastGood),
		ph(Unpack, "unpack the bundle", t.unpack),
		ph(SmokeTest, "smoke test of the new binaries", t.smokeTest),
		ph(Signal, "write the signal", t.writeNewSignal),
		rollBack(ph(Switch, "current names the new release", t.switchCurrent), func(err error) string {
			return fmt.Sprintf("switching to %s failed: %v", t.sig.ToRelease, err)
		}),
		rollBack(ph(Units, "the new release's unit files", t.units), func(err error) string {
			return fmt.Sprintf("installing the unit files of %s failed: %v", t.sig.ToVersion, err)
		}),
		rollBack(ph(Restart, "the new watcher runs", t.restart), func(err error) string {
			return fmt.Sprintf("new watcher %s could not be restarted: %v; rolled back to %s", t.sig.ToVersion, err, t.sig.FromVersion)
		}),
		rollBack(ph(Health, "health gate", t.health), func(err error) string {
			if u, ok := errors.AsType[*unhealthy](err); ok {
				return fmt.Sprintf("new watcher %s %s; rolled back to %s", t.sig.ToVersion, u.why, t.sig.FromVersion)
			}
			return fmt.Sprintf("new watcher %s: health gate: %v; rolled back to %s", t.sig.ToVersion, err, t.sig.FromVersion)
		}).Final(),
		ph(Rollback, "current names last-good again", t.rollBack).Final(),
		// Not a step of an upgrade: the recovery unit's run, alone (Recover).
		ph(Recovery, "current names last-good, the watcher restarted", t.recover).Final(),
	}
}

// PhaseChains are the chains of the upgrade's table (transition.Chains),
// for DESIGN.md's diagram.
func PhaseChains() [][]string {
	return transition.Chains((&txn{}).table())
}

// Pausable names what the test hook KUBESLOT_TEST_PAUSE_AT may pause an
// upgrade before (lib/stagekit): any of Phases; the run stops before that
// phase and waits to be killed.
func Pausable() []string {
	var names []string
	for _, p := range Phases() {
		names = append(names, string(p))
	}
	return names
}

// run runs the table from phase from, then settles the outcome: refused
// before the switch, rolled back after it, or healthy.
func (t *txn) run(ctx context.Context, from Phase) (*Result, error) {
	tr := transition.Runner{Stage: "upgrade", Log: t.log, From: string(from), StopOnCancel: true, Now: t.d.Now,
		Pause: t.d.Pause,
		// The signal exists already when a resume checks the new release
		// again.
		Skip: func(name string) bool { return name == string(Signal) && t.sig != nil },
		Save: func(_ context.Context, p transition.Phase) error {
			// The phase being run is in the progress status and the signal,
			// with no duration yet.
			t.phases = append(t.phases, requests.PhaseTiming{Name: p.Name, StartedAt: t.d.now().UTC()})
			if t.sig == nil || t.sig.SwitchedAt.IsZero() {
				t.progress(Phase(p.Name))
			}
			return nil
		},
		Timed: func(tm requests.PhaseTiming, _ error) { t.phases[len(t.phases)-1] = tm },
	}
	_, err := tr.Run(ctx, t.table())
	pe, _ := errors.AsType[*transition.PhaseError](err)
	switch {
	case pe != nil && pe.Stopped:
		// The test hook or a stop: as a crash, the next run resumes.
		return nil, &interrupted{pe.Err}
	case err != nil && (pe == nil || !pe.Ran):
		return nil, err
	case err != nil && pe.Phase == string(Rollback):
		return nil, fmt.Errorf("roll back (%s): %w", t.reason, pe.Err)
	case err != nil:
		return t.refuse(ctx, t.toDir, pe.Err)
	case t.reason != "":
		return t.rolledBack(ctx)
	}
	return t.healthy(ctx)
}

func (t *txn) preflight(ctx context.Context) error {
	d := t.d
	from, err := release.Current(d.Root)
	if err != nil {
		return err
	}
	to, err := release.Inactive(d.Root)
	if err != nil {
		return err
	}
	fromDir, err := release.Dir(d.Root, from)
	if err != nil {
		return err
	}
	if t.toDir, err = release.Dir(d.Root, to); err != nil {
		return err
	}
	t.res.FromRelease, t.res.ToRelease = from, to
	t.res.FromVersion, err = t.version(ctx, fromDir)
	return err
}

// download fetches the bundle (verified against the sha256 asked for) and,
// when the host names trusted keys, checks its signature: a bundle nobody
// the host trusts signed is refused before anything of it is unpacked,
// whoever could create the operation.
func (t *txn) download(ctx context.Context) error {
	var err error
	if t.local, err = t.fetch(ctx); err != nil {
		return err
	}
	if err := t.d.TrustedKeysErr; err != nil {
		return fmt.Errorf("refused, nothing unpacked: %w", err)
	}
	keys := t.d.TrustedKeys
	if len(keys) == 0 {
		return nil
	}
	src := t.req.Upgrade.URL
	sig, err := t.d.Signature(ctx, src)
	if err != nil {
		return fmt.Errorf("refused, nothing unpacked: upgrade.trusted_keys asks for a signature, and %s%s: %w", artifact.Redact(src), bundle.SignatureSuffix, err)
	}
	id, err := bundle.VerifySignature(t.local, sig, keys)
	if err != nil {
		return fmt.Errorf("refused, nothing unpacked (upgrade.trusted_keys): %w", err)
	}
	t.log.Info("bundle signature verified", "key", id)
	return nil
}

// lastGood makes the running release last-good. That ends a probation of
// it (requests.Probation) early: asking for the next upgrade trusts the
// running release. A rollback recorded there and not yet published stays.
func (t *txn) lastGood(context.Context) error {
	if err := release.SetLastGood(t.d.Root, t.res.FromRelease); err != nil {
		return err
	}
	p, err := t.d.Requests.ReadProbation()
	if err != nil {
		t.log.Warn("could not read the upgrade probation file; leaving it", "err", err)
		return nil
	}
	if p != nil && p.Reason == "" && p.ToRelease == t.res.FromRelease {
		t.log.Info("the running release was on probation; last-good names it now", "release", p.ToRelease, "version", p.ToVersion)
		return t.d.Requests.RemoveProbation()
	}
	return nil
}

func (t *txn) unpack(ctx context.Context) error {
	if err := os.RemoveAll(t.toDir); err != nil {
		return fmt.Errorf("remove the old inactive release %s: %w", t.toDir, err)
	}
	m, err := t.d.Bundles.Unpack(ctx, t.local, strings.ToLower(t.req.Upgrade.SHA256), t.d.Arch, t.toDir)
	if err != nil {
		return err
	}
	t.res.ToVersion = m.Version
	return nil
}

// smokeTest runs the new binaries; a resume reads the manifest again first.
func (t *txn) smokeTest(ctx context.Context) error {
	if t.sig != nil {
		if _, err := t.d.Bundles.ReadManifest(t.toDir); err != nil {
			return err
		}
	}
	return t.smoke(ctx, t.toDir, t.res.ToVersion)
}

func (t *txn) writeNewSignal(context.Context) error {
	t.sig = &requests.UpgradeSignal{RequestID: t.req.ID, Operation: t.req.Operation, MachineGeneration: t.req.MachineGeneration,
		FromRelease: t.res.FromRelease, FromVersion: t.res.FromVersion, ToRelease: t.res.ToRelease, ToVersion: t.res.ToVersion}
	return t.writeSignal()
}

func (t *txn) switchCurrent(context.Context) error {
	t.sig.SwitchedAt = t.d.now().UTC()
	if err := t.writeSignal(); err != nil {
		return err
	}
	return release.SetCurrent(t.d.Root, t.sig.ToRelease)
}

func (t *txn) units(ctx context.Context) error {
	if err := installReleaseUnits(ctx, t.d, t.rec, t.toDir, t.log); err != nil {
		return err
	}
	return t.writeSignal()
}

// restart hands the lock to the new watcher, which takes it when it starts,
// and gets it running.
func (t *txn) restart(ctx context.Context) error {
	t.release()
	var err error
	t.h, err = t.handOver(ctx, t.toDir)
	return err
}

func (t *txn) health(ctx context.Context) error {
	why, err := gate(ctx, t.d, t.toDir, t.h, t.j.HealthWindow, t.j.HealthTimeout)
	if err != nil {
		return err
	}
	if why != "" {
		return &unhealthy{why}
	}
	t.res.Healthy = t.d.now().Sub(t.sig.SwitchedAt)
	return nil
}

// rollBack points current back at the release the upgrade came from and
// reinstalls its units, under the lock taken again. It finishes even when
// the run was told to stop.
func (t *txn) rollBack(ctx context.Context) error {
	d, s := t.d, t.sig
	ctx = context.WithoutCancel(ctx)
	if err := t.relock(ctx); err != nil {
		return err
	}
	fromDir, err := release.Dir(d.Root, s.FromRelease)
	if err != nil {
		return err
	}
	if err := release.SetCurrent(d.Root, s.FromRelease); err != nil {
		return err
	}
	if err := installReleaseUnits(ctx, d, t.rec, fromDir, t.log); err != nil {
		// current is back; the unit files are what a later run repairs.
		t.log.Error("reinstalling the old release's unit files failed", "err", err)
	}
	return nil
}

// healthy records a healthy new watcher: the lock taken again, the signal
// verified (unless the new watcher reported it already, or the recovery
// unit rolled back meanwhile), the request finished.
func (t *txn) healthy(ctx context.Context) (*Result, error) {
	d, s := t.d, t.sig
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

// rolledBack records the rollback's reason in the signal (unless a failure
// is already there), finishes the request and restarts the old watcher.
func (t *txn) rolledBack(ctx context.Context) (*Result, error) {
	d, s := t.d, t.sig
	ctx = context.WithoutCancel(ctx)
	cur, err := d.Requests.ReadUpgradeSignal()
	if err != nil {
		return nil, err
	}
	if cur != nil && cur.RequestID == s.RequestID {
		t.sig = cur // a failure the recovery unit recorded is kept
	}
	if t.sig.Failure == "" {
		t.sig.Failure = bounded(t.reason)
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
	fromDir, err := release.Dir(d.Root, s.FromRelease)
	if err == nil {
		err = restartWatcher(ctx, d)
	}
	if err != nil {
		t.log.Error("restarting the old watcher failed", "err", err)
	} else if why, err := waitActive(ctx, d, fromDir, t.j.HealthTimeout); err != nil || why != "" {
		t.log.Error("the old watcher is not active after the rollback", "why", why, "err", err)
	} else if !s.SwitchedAt.IsZero() {
		t.res.RolledBack = d.now().Sub(s.SwitchedAt)
	}
	t.res.Outcome, t.res.Message = RolledBack, t.sig.Failure
	return &t.res, fmt.Errorf("%w: %s", ErrRolledBack, t.sig.Failure)
}
