package upgrade

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/artifact"
	"github.com/kubeslot/kubeslot/lib/bundle"
	"github.com/kubeslot/kubeslot/lib/cachekeep"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/release"
	"github.com/kubeslot/kubeslot/lib/requests"
)

// txn is one run of the upgrade transition.
type txn struct {
	d   *Deps
	j   Job
	log *slog.Logger
	// held is the prologue's hold; lock is its lock while held (nil while
	// let go around the watcher's restart).
	held *ownership.Held
	lock *ownership.Lock
	rec  *ownership.Record
	req  *requests.Request
	// manual is an upgrade by hand: no claimed request file.
	manual bool
	sig    *requests.UpgradeSignal
	// refused are the request files moved aside by this run's sweep.
	refused []requests.Refused
	phases  []requests.PhaseTiming
	res     Result
	t0      time.Time
	// toDir is the release directory upgraded to; local the bundle file.
	toDir, local string
	// h is how the new watcher came to run (restart), for the gate.
	h handover
	// reason is why the upgrade rolls back (a failure after the switch).
	reason string
	// recovered is what the phase Recovery did.
	recovered *Result
}

// Run is the upgrade stage: lock, admission, then resume an interrupted
// upgrade, or claim the request, or upgrade by hand from j.Bundle. The
// returned error carries the exit code (exitcode.Defer for a busy lock or an
// incomplete installation); ErrRolledBack and ErrRefused wrap a failed
// upgrade.
func Run(ctx context.Context, d *Deps, j Job) (*Result, error) {
	t, err := begin(ctx, d, j, "the installation is not complete (bootstrap still to run)")
	if err != nil {
		return nil, err
	}
	defer t.release()
	// Under the lock: what killed downloads left in the artifact cache, and
	// the entries nothing uses any more, a finished upgrade's bundle among
	// them (lib/cachekeep keeps a claimed or pending upgrade's). A failure
	// costs only disk.
	if err := cachekeep.Prune(d.Root, t.log); err != nil {
		t.log.Warn("artifact cache not tidied", "err", err.Error())
	}
	res, err := t.dispatch(ctx)
	if res != nil {
		res.Took = d.now().Sub(t.t0)
	}
	return res, err
}

// begin checks the dependencies, then runs the stage prologue
// (ownership.Begin): the installation lock and the ownership record; an
// incomplete installation defers (69) with why. The caller releases the
// lock.
func begin(ctx context.Context, d *Deps, j Job, incomplete string) (*txn, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	j.defaults()
	t := &txn{d: d, j: j, log: d.Log, t0: d.now()}
	held, err := d.Begin(ctx, ownership.Prologue{Stage: j.Stage, Wait: j.LockWait,
		Admit: ownership.RequireComplete(incomplete), Log: t.log})
	if err != nil {
		return nil, err
	}
	t.held, t.lock, t.rec = held, held.Lock, held.Record
	return t, nil
}

// dispatch decides between resume, claim and an upgrade by hand.
func (t *txn) dispatch(ctx context.Context) (*Result, error) {
	d := t.d
	sig, err := d.Requests.ReadUpgradeSignal()
	if err != nil {
		return nil, err
	}
	// An unusable request file is moved aside (Failed) before anything
	// reads it, so it never blocks this or a later upgrade.
	refused, err := d.Requests.SweepRefused(t.lock, requests.Upgrade)
	if err != nil {
		return nil, err
	}
	for _, r := range refused {
		t.log.Warn("upgrade request refused and moved aside", "file", r.File, "moved_to", r.MovedTo, "request", r.RequestID, "reason", r.Reason)
	}
	t.refused = refused
	claimed, err := d.Requests.Claimed(requests.Upgrade)
	if err != nil {
		return nil, err
	}
	switch {
	case sig != nil && (sig.Verified || sig.Failure != ""):
		return t.finished(sig, claimed)
	case sig != nil:
		return t.resumeSignal(ctx, sig, claimed)
	case claimed != nil:
		t.req = claimed
		t.log = t.log.With("request", claimed.ID)
		t.log.Info("resuming a claimed upgrade request from the download", "request", claimed.ID)
		res, err := t.fresh(ctx)
		if err == nil && t.j.Bundle != "" {
			err = t.notStarted("the claimed upgrade request " + claimed.ID + " was finished first")
		}
		return res, err
	case t.j.Bundle != "":
		return t.byHand(ctx)
	}
	return t.claim(ctx)
}

// notStarted is the error of a run by hand whose --bundle waits for
// another upgrade, which ran first.
func (t *txn) notStarted(what string) error {
	return exitcode.Defer(fmt.Errorf("%s; --bundle %s was not started: run it again", what, t.j.Bundle))
}

// finished handles a signal that is verified or failed, which the watcher
// has not reported yet.
func (t *txn) finished(sig *requests.UpgradeSignal, claimed *requests.Request) (*Result, error) {
	if claimed != nil && claimed.ID == sig.RequestID {
		t.lockedFinish()
		t.log.Info("finished the interrupted upgrade's request", "request", sig.RequestID)
	}
	pending, err := t.d.Requests.Pending(requests.Upgrade)
	if err != nil {
		return nil, err
	}
	if pending != nil || (claimed != nil && claimed.ID != sig.RequestID) || t.j.Bundle != "" {
		p, _ := t.d.Requests.UpgradeSignalPath()
		return nil, exitcode.Defer(fmt.Errorf("upgrade %s finished but the watcher has not reported it yet (%s is still there): a new upgrade waits for that", sig.RequestID, p))
	}
	return &Result{RequestID: sig.RequestID, Outcome: Nothing, Message: "upgrade " + sig.RequestID + " already finished; the watcher reports it"}, nil
}

// resumeSignal resumes the upgrade of a signal neither verified nor failed.
func (t *txn) resumeSignal(ctx context.Context, sig *requests.UpgradeSignal, claimed *requests.Request) (*Result, error) {
	t.sig = sig
	t.phases = append([]requests.PhaseTiming(nil), sig.Phases...)
	if claimed != nil && claimed.ID == sig.RequestID {
		t.req = claimed
	} else {
		t.manual = true
		t.req = &requests.Request{Kind: requests.Upgrade, ID: sig.RequestID, Operation: sig.Operation, MachineGeneration: sig.MachineGeneration}
	}
	t.log = t.log.With("request", sig.RequestID)
	t.log.Info("resuming an interrupted upgrade", "from", sig.FromRelease, "to", sig.ToRelease)
	res, err := t.resume(ctx)
	if err == nil && t.j.Bundle != "" {
		err = t.notStarted("an interrupted upgrade " + sig.RequestID + " was finished first")
	}
	return res, err
}

// byHand upgrades from the --bundle file.
func (t *txn) byHand(ctx context.Context) (*Result, error) {
	abs, err := filepath.Abs(t.j.Bundle)
	if err != nil {
		return nil, err
	}
	id := fmt.Sprintf("upgrade-0-manual-%d", t.d.now().Unix())
	t.manual = true
	t.req = &requests.Request{Kind: requests.Upgrade, ID: id, Reason: "kubeslot-upgrader --bundle",
		Upgrade: &requests.UpgradeParams{URL: abs, SHA256: strings.ToLower(t.j.SHA256)}, CreatedAt: t.d.now().UTC()}
	t.log = t.log.With("request", id)
	return t.fresh(ctx)
}

// claim claims the pending request and runs it.
func (t *txn) claim(ctx context.Context) (*Result, error) {
	req, err := t.d.Requests.Claim(t.lock, requests.Upgrade)
	if errors.Is(err, requests.ErrNoRequest) {
		if refused := append(t.refused, requests.AsRefused(err)...); len(refused) > 0 {
			// Someone asked, but not in a form the upgrader can run: say
			// so, not "no request to claim".
			msg := make([]string, 0, len(refused))
			for _, r := range refused {
				msg = append(msg, fmt.Sprintf("%s moved aside to %s: %s", r.File, r.MovedTo, r.Reason))
			}
			return &Result{Outcome: Nothing, Message: "nothing run: the upgrade request was refused: " + strings.Join(msg, "; ")}, nil
		}
		if t.j.Triggered {
			return &Result{Outcome: Nothing, Message: "no upgrade request to claim"}, nil
		}
		return nil, exitcode.UsageError(errors.New("no upgrade request is pending: give --bundle FILE to upgrade by hand"))
	}
	if err != nil {
		return nil, err
	}
	t.req = req
	t.log = t.log.With("request", req.ID)
	t.log.Info("claimed the upgrade request", "operation", req.Operation, "source", artifact.Redact(req.Upgrade.URL))
	return t.fresh(ctx)
}

func (t *txn) release() {
	t.held.Release()
	t.lock = nil
}

// relock takes the lock again after the restart; it is needed to finish
// the request.
func (t *txn) relock(ctx context.Context) error {
	if err := t.held.Retake(ctx); err != nil {
		return err
	}
	t.lock = t.held.Lock
	return nil
}

// lockedFinish removes the claimed request (nothing for one by hand).
func (t *txn) lockedFinish() {
	if t.manual || t.lock == nil {
		return
	}
	if err := t.d.Requests.Finish(t.lock, requests.Upgrade); err != nil {
		t.log.Warn("could not remove the claimed request", "err", err)
	}
}

// progress publishes an InProgress status; only before the switch, since
// after it the final status belongs to the watcher that runs.
func (t *txn) progress(p Phase) {
	msg := fmt.Sprintf("upgrade: %s", p)
	if t.res.ToVersion != "" {
		msg = fmt.Sprintf("upgrade %s -> %s: %s", t.res.FromVersion, t.res.ToVersion, p)
	}
	if err := t.d.Requests.WriteStatus(t.status(requests.InProgress, msg)); err != nil {
		t.log.Warn("could not write progress", "err", err)
	}
}

func (t *txn) status(phase requests.Phase, msg string) *requests.Status {
	return &requests.Status{RequestID: t.req.ID, Kind: requests.Upgrade, Operation: t.req.Operation,
		MachineGeneration: t.req.MachineGeneration, Phase: phase, Message: msg,
		Phases: append([]requests.PhaseTiming(nil), t.phases...)}
}

// fresh runs the transition from the start: no signal exists.
func (t *txn) fresh(ctx context.Context) (*Result, error) {
	if t.req.Upgrade == nil {
		return nil, fmt.Errorf("request %s names no bundle", t.req.ID)
	}
	t.res.RequestID = t.req.ID
	return t.run(ctx, Preflight)
}

// resume continues from a signal that is neither verified nor failed.
func (t *txn) resume(ctx context.Context) (*Result, error) {
	d, s := t.d, t.sig
	t.res = Result{RequestID: s.RequestID, FromRelease: s.FromRelease, FromVersion: s.FromVersion, ToRelease: s.ToRelease, ToVersion: s.ToVersion}
	cur, err := release.Current(d.Root)
	if err != nil {
		return nil, err
	}
	if cur != s.ToRelease && cur != s.FromRelease {
		return nil, fmt.Errorf("upgrade %s: current names %s, neither the release it came from (%s) nor the one it went to (%s): repair by hand (kubeslot-upgrader recover points current at last-good)",
			s.RequestID, cur, s.FromRelease, s.ToRelease)
	}
	if t.toDir, err = release.Dir(d.Root, s.ToRelease); err != nil {
		return nil, err
	}
	if cur == s.FromRelease {
		// Not switched yet: check the new release again, it may have been
		// changed since the signal was written.
		return t.run(ctx, SmokeTest)
	}
	if s.SwitchedAt.IsZero() {
		s.SwitchedAt = d.now().UTC()
	}
	return t.run(ctx, Units)
}

// refuse handles a failure before the switch: the status says Failed, the
// half-made release directory goes, nothing was switched.
func (t *txn) refuse(ctx context.Context, toDir string, cause error) (*Result, error) {
	if isInterrupted(ctx, cause) {
		return nil, cause
	}
	msg := bounded(fmt.Sprintf("upgrade refused before the switch, %s still runs: %v", versionOr(t.res.FromVersion, t.res.FromRelease), cause))
	t.log.Error("upgrade refused", "err", cause)
	if cur, err := release.Current(t.d.Root); err == nil && toDir != "" && filepath.Base(toDir) != cur {
		if lg, err := release.LastGood(t.d.Root); err != nil || lg != filepath.Base(toDir) {
			if err := os.RemoveAll(toDir); err != nil {
				t.log.Warn("could not remove the half-made release", "dir", toDir, "err", err)
			}
		}
	}
	if t.sig != nil {
		if err := t.d.Requests.RemoveUpgradeSignal(); err != nil {
			return nil, err
		}
	}
	if err := t.d.Requests.WriteStatus(t.status(requests.Failed, msg)); err != nil {
		return nil, err
	}
	t.lockedFinish()
	t.res.Outcome, t.res.Message = Refused, msg
	return &t.res, fmt.Errorf("%w: %s", ErrRefused, msg)
}

func versionOr(v, rel string) string {
	if v != "" {
		return v
	}
	return "release " + rel
}

// writeSignal writes t.sig with the phases so far.
func (t *txn) writeSignal() error {
	t.sig.Phases = append([]requests.PhaseTiming(nil), t.phases...)
	return t.d.Requests.WriteUpgradeSignal(t.sig)
}

// fetch returns the local bundle: a file by hand in place, else through the
// artifact cache.
func (t *txn) fetch(ctx context.Context) (string, error) {
	src := t.req.Upgrade.URL
	if t.manual {
		fi, err := os.Stat(src)
		if err != nil {
			return "", fmt.Errorf("bundle %s: %w", src, err)
		}
		if !fi.Mode().IsRegular() {
			return "", fmt.Errorf("bundle %s: not a regular file", src)
		}
		return src, nil
	}
	return t.d.Fetcher.Fetch(ctx, src, t.req.Upgrade.SHA256)
}

// version is the release version of dir: its manifest's, or for a release
// without one (laid down by `kubeslot ignition`) what its watcher says.
func (t *txn) version(ctx context.Context, dir string) (string, error) {
	return releaseVersion(ctx, t.d, dir)
}

func releaseVersion(ctx context.Context, d *Deps, dir string) (string, error) {
	m, err := d.Bundles.ReadManifest(dir)
	if err == nil {
		return m.Version, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	name := "kubeslot-watcher"
	out, verr := runVersion(ctx, d, filepath.Join(dir, name))
	if verr != nil {
		return "", fmt.Errorf("release %s has no manifest, and %w", dir, verr)
	}
	v, ok := strings.CutPrefix(out, name+" ")
	if !ok || v == "" {
		return "", fmt.Errorf("release %s has no manifest, and %s --version printed %q", dir, name, out)
	}
	return v, nil
}

func runVersion(ctx context.Context, d *Deps, p string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, d.versionTimeout())
	defer cancel()
	out, err := d.Exec.Output(ctx, p, "--version")
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", p, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// smoke runs every binary of the release dir with --version: each must
// answer "<name> <version>" within 5 s.
func (t *txn) smoke(ctx context.Context, dir, version string) error {
	return smoke(ctx, t.d, dir, version)
}

func smoke(ctx context.Context, d *Deps, dir, version string) error {
	for _, name := range bundle.Binaries {
		out, err := runVersion(ctx, d, filepath.Join(dir, name))
		if err != nil {
			return fmt.Errorf("smoke test: %w", err)
		}
		if want := name + " " + version; out != want {
			return fmt.Errorf("smoke test: %s --version printed %q, want %q (the manifest's version)", filepath.Join(dir, name), out, want)
		}
	}
	return nil
}
