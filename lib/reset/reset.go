// Package reset is the logic of the resetter stage (cmd/kubeslot-resetter):
// it removes kubeslot from a host in a fixed order of named, idempotent
// steps, under the installation lock, from the ownership record's journal.
// Imported by cmd/kubeslot-resetter only.
//
// Order (StepsFor): mark the record resetting → install the resetting unit
// (resetting.go) → report the AgentReset request Succeeded (request path
// only; the watcher gets a bounded moment to publish it) → stop the watcher
// (by hand; on the request path it is stopped last, see below) → stop and
// disable the path units, the recovery unit and every waiting worker
// (template instances found by pattern) → stop the slots' node machines →
// remove nspawn settings, drop-ins and the machines' boot links → remove the
// slots' rootfs → undo the rest of the journal, newest first → remove the
// join token from the operator's configuration (token.go) → stop, disable
// and remove the first-boot unit → (request path) stop the watcher → remove
// every kubeslot unit file and reload systemd → remove the host root (all but
// the record and the resetter's copy) → remove the record, then the
// resetting unit and the empty base directory. Each step ends with a syncfs
// of the filesystems it touched.
//
// Resumable: the record stays `resetting` until the last step, and every
// step treats "already gone" as done, so a re-run after a crash or a kill at
// any point finishes the job. The re-run needs nobody: kubeslot-reset.service
// only hands a request over (Run: handOver) to kubeslot-resetting.service,
// which runs a copy of this binary that outlives the installation's units
// and releases, is restarted after a kill and started at boot after a power
// cut. Any other failure stops the run and names what to fix; the record
// stays `resetting`, and bootstrap refuses the host until a reset finishes.
//
// Only what kubeslot made: host paths outside the base are changed only
// through the journal (each entry restored to its recorded prior state), with
// one exception by exact name, never by pattern: kubeslot's own unit files
// (units.Names, and units.Resetting, which the reset itself writes) in
// /etc/systemd/system and their enablement links, which Ignition may have
// laid down before any journal existed. The base directory
// is kubeslot's own by definition (DESIGN.md, "Host layout"). The bootstrap
// configuration /etc/kubeslot/config.toml is the operator's input and stays,
// but without its join token (token.go), in place and atomically; with the
// first-boot unit gone, nothing re-bootstraps the host from it, and setting
// a fresh token makes it a configuration to bootstrap with again.
package reset

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/kubeslot/kubeslot/lib/hostprep"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/transition"
	"github.com/kubeslot/kubeslot/units"
)

// Stage is the holder name written into the installation lock.
const Stage = "kubeslot-resetter"

// Defaults of the bounded waits.
const (
	DefaultLockWait    = 30 * time.Second
	DefaultPublishWait = 20 * time.Second
	DefaultStopWait    = 2 * time.Minute
	unitWait           = time.Minute
	goneWait           = 15 * time.Second
)

// Deps is everything a run is built from. Root, Log, Systemd and Sys are
// required.
type Deps struct {
	Root *hostroot.Root
	Log  *slog.Logger
	// Begin is the stage prologue: the installation lock (busy: 69), then
	// the admission it is given (stagekit.Driver.Begin).
	Begin   func(context.Context, ownership.Prologue) (*ownership.Held, error)
	Systemd isolation.SystemdConn
	// Sys undoes host preparation (hostprep.ExecSystem on a host).
	Sys hostprep.System
	// Request: the run serves an AgentReset request (KUBESLOT_REQUEST=reset,
	// from kubeslot-reset.service): the request is claimed and reported
	// Succeeded before the watcher is stopped.
	Request bool
	// LockWait, PublishWait and StopWait bound the lock, the watcher's
	// publication of the request's result, and stopping one node machine;
	// zero means the defaults.
	LockWait, PublishWait, StopWait time.Duration
	// Before is called before each step with its name (tests inject
	// failures; the binary implements KUBESLOT_TEST_PAUSE_AT with it). An
	// error stops the run there.
	Before func(ctx context.Context, step string) error
	// Force resets an installation whose ownership record is damaged,
	// from what ownership.Salvage keeps of it (kubeslot-resetter --force):
	// journal entries it lost are not undone.
	Force bool
	// Resume: the run finishes a reset under way and never starts one
	// (kubeslot-resetter --resume, what units.Resetting runs). With no
	// reset under way it only removes what is left of that unit.
	Resume bool
	// Self is the path of the running resetter, copied into the host root
	// for units.Resetting (os.Executable in the binary).
	Self string
}

func (d *Deps) wait(v, def time.Duration) time.Duration {
	if v > 0 {
		return v
	}
	return def
}

// Step is one named, idempotent step of a reset.
type Step struct {
	Name string
	// What says what the step removes, for messages.
	What string
	run  func(r *runner, ctx context.Context) error
}

// Step names, in order.
const (
	StepMarkResetting       = "mark-resetting"
	StepInstallResetting    = "install-resetting-unit"
	StepReportRequest       = "report-request"
	StepStopWatcher         = "stop-watcher"
	StepStopUnits           = "stop-units"
	StepStopMachines        = "stop-machines"
	StepRemoveNspawn        = "remove-nspawn"
	StepRemoveRootfs        = "remove-rootfs"
	StepUndoJournal         = "undo-journal"
	StepRemoveJoinToken     = "remove-join-token"
	StepRemoveBootstrapUnit = "remove-bootstrap-unit"
	StepRemoveUnits         = "remove-units"
	StepRemoveHostRoot      = "remove-host-root"
	StepRemoveRecord        = "remove-record"
)

// Steps returns the steps in the order a reset by hand runs them: the
// watcher is stopped first, so nothing acts on the cluster's behalf while
// the host is taken apart. A fresh slice each call.
func Steps() []Step { return StepsFor(false) }

// StepsFor returns the steps in the order a run runs them. A run serving an
// AgentReset request (request) reports the request Succeeded only after
// every step that can fail on the host's account (machines, rootfs, the
// journal's undo, the first-boot unit), then stops the watcher, the last
// kubeslot process, before the unit files and the host root it reads are
// removed: the watcher keeps the Machine informed for as long as there is a
// node and publishes the result, and it cannot recreate files in a host
// root that is already gone. A step that fails before the report is
// reported Failed, naming it. Both orders run the same steps. A fresh slice
// each call.
func StepsFor(request bool) []Step {
	steps := []Step{
		{StepMarkResetting, "mark the ownership record resetting", (*runner).markResetting},
		{StepInstallResetting, "install " + units.Resetting + " and the resetter's copy it runs, which finish the reset after a kill or at the next boot", (*runner).installResetting},
		{StepReportRequest, "report the AgentReset request Succeeded (request path only)", (*runner).reportRequest},
		{StepStopWatcher, "stop the watcher", (*runner).stopWatcher},
		{StepStopUnits, "stop and disable the path units, the recovery unit and every worker unit instance", (*runner).stopUnits},
		{StepStopMachines, "stop the slots' node machines and unmount their layered rootfs", (*runner).stopMachines},
		{StepRemoveNspawn, "remove nspawn settings, drop-ins and boot links", (*runner).removeNspawn},
		{StepRemoveRootfs, "remove the slots' rootfs", (*runner).removeRootfs},
		{StepUndoJournal, "undo the remaining host changes of the journal, newest first", (*runner).undoJournal},
		{StepRemoveJoinToken, "remove the join token from " + units.ConfigPath + ", keeping the rest of it", (*runner).removeJoinToken},
		{StepRemoveBootstrapUnit, "stop, disable and remove the first-boot unit", (*runner).removeBootstrapUnit},
		{StepRemoveUnits, "remove every kubeslot unit file and reload systemd", (*runner).removeUnits},
		{StepRemoveHostRoot, "remove the host root (all but the ownership record and the resetter's copy)", (*runner).removeHostRoot},
		{StepRemoveRecord, "remove the ownership record, the resetter's copy, the empty host root and " + units.Resetting, (*runner).removeRecord},
	}
	if !request {
		return steps
	}
	// Move report-request and stop-watcher to just before remove-units.
	var out []Step
	var report, watcher Step
	for _, s := range steps {
		switch s.Name {
		case StepReportRequest:
			report = s
			continue
		case StepStopWatcher:
			watcher = s
			watcher.What = "stop the watcher, the last kubeslot process (request path: after it published the result and the node is gone)"
			continue
		case StepRemoveUnits:
			out = append(out, report, watcher)
		}
		out = append(out, s)
	}
	return out
}

// StepNames lists the step names in order.
func StepNames() []string {
	var out []string
	for _, s := range Steps() {
		out = append(out, s.Name)
	}
	return out
}

// Result says what a run did.
type Result struct {
	// Nothing: no ownership record, nothing was reset.
	Nothing   bool
	InstallID string
	// Resumed: the record was already resetting.
	Resumed bool
	// RequestID is the AgentReset request served (request path).
	RequestID string
	// HandedOver: the run marked the host resetting and started
	// units.Resetting, which does the work (request path).
	HandedOver bool
	// Steps are the steps run, with their timings.
	Steps []requests.PhaseTiming
}

// StepError is a failed step; the record stays resetting.
type StepError struct {
	Step string
	Err  error
}

func (e *StepError) Error() string {
	return fmt.Sprintf("reset step %s: %v; the ownership record stays \"resetting\": fix that and run kubeslot-resetter again, it resumes", e.Step, e.Err)
}

func (e *StepError) Unwrap() error { return e.Err }

// Run resets the host: installation lock (busy → exit 69), the record
// (none → Nothing), then every step in order.
func Run(ctx context.Context, d Deps) (*Result, error) {
	if d.Root == nil || d.Begin == nil || d.Systemd == nil || d.Sys == nil {
		return nil, errors.New("reset: Root, Begin, Systemd and Sys are required")
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	held, err := d.Begin(ctx, ownership.Prologue{Stage: Stage, Wait: d.wait(d.LockWait, DefaultLockWait),
		WaitName: "lock wait", Admit: d.admit, Log: d.Log})
	if err != nil {
		return nil, err
	}
	defer held.Release()
	lock, rec := held.Lock, held.Record
	res := &Result{}
	if rec == nil {
		res.Nothing = true
		// What an interrupted end of a reset may have left.
		if err := removeResetting(ctx, d, d.Log); err != nil {
			return res, err
		}
		return res, nil
	}
	res.InstallID, res.Resumed = rec.InstallID, rec.Checkpoint == ownership.CheckpointResetting
	r := &runner{d: d, rec: rec, lock: lock, log: d.Log.With("install_id", rec.InstallID)}
	switch {
	case d.Resume && !res.Resumed:
		// A resetting unit left by a reset that finished, on a host
		// bootstrapped again since: it must not reset this one.
		r.log.Info("no reset under way: removing what is left of the resetting unit", "checkpoint", rec.Checkpoint)
		res.Nothing = true
		return res, removeResetting(ctx, d, r.log)
	case d.Request && !d.Resume:
		return res, r.handOver(ctx, res)
	}
	if d.Request {
		req, err := requests.New(d.Root).Claim(lock, requests.Reset)
		switch {
		case errors.Is(err, requests.ErrNoRequest) && res.Resumed:
			// The request was reported (and so finished) before a kill or
			// a power cut: the record says a reset is under way, and with
			// the path units stopped nothing else would finish it.
			r.log.Info("no reset request left, but a reset is under way: finishing it")
		case errors.Is(err, requests.ErrNoRequest):
			if refused := requests.AsRefused(err); len(refused) > 0 {
				r.log.Warn("nothing run: the reset request was refused and moved aside", "err", err.Error())
			} else {
				r.log.Info("no reset request to serve: nothing done (run kubeslot-resetter by hand to reset anyway)")
			}
			res.Nothing = true
			return res, nil
		case err != nil:
			return res, fmt.Errorf("claim the reset request: %w", err)
		default:
			r.req, res.RequestID = req, req.ID
		}
	}
	if res.Resumed {
		r.log.Info("resuming an unfinished reset")
	} else {
		r.log.Info("reset started", "machine", rec.Machine, "checkpoint", rec.Checkpoint)
	}
	steps, err := r.runSteps(ctx, StepsFor(d.Request))
	res.Steps = steps
	return res, err
}

// admit is the reset's admission (ownership.Prologue.Admit): any record is
// reset, and none means nothing to do; a damaged one only with Force, from
// what ownership.Salvage keeps of it.
func (d *Deps) admit(rec *ownership.Record, err error) (*ownership.Record, error) {
	if errors.Is(err, ownership.ErrDamagedRecord) && d.Force {
		var lost []string
		if rec, lost, err = ownership.Salvage(d.Root); err != nil {
			return nil, fmt.Errorf("--force: %w", err)
		}
		for _, l := range lost {
			d.Log.Warn("forced reset of a damaged ownership record: not undone", "lost", l)
		}
		// The salvaged record replaces the damaged one (marked resetting),
		// so a re-run resumes like any interrupted reset.
		if err := ownership.Save(d.Root, rec); err != nil {
			return nil, fmt.Errorf("--force: replace the damaged ownership record: %w", err)
		}
		d.Log.Warn("forced reset: the damaged ownership record was replaced by what could be salvaged", "install_id", rec.InstallID,
			"journal_entries_kept", len(rec.Journal), "lost", len(lost))
	}
	if errors.Is(err, ownership.ErrDamagedRecord) {
		return nil, fmt.Errorf("cannot reset from the ownership record: %w; kubeslot-resetter --dry-run --force shows what a forced reset would do", err)
	}
	if err != nil {
		return nil, fmt.Errorf("cannot reset from the ownership record: %w", err)
	}
	return rec, nil
}

// runSteps runs steps through the stage runner (lib/transition): for each,
// the test hook (Deps.Before), the step, a sync of what it touched. The
// record is already durable (mark-resetting is the first step), so there is
// nothing to save before a step. A failure is a *StepError, reported on the
// request if it came before the report.
func (r *runner) runSteps(ctx context.Context, steps []Step) ([]requests.PhaseTiming, error) {
	phases := make([]transition.Phase, len(steps))
	for i, s := range steps {
		phases[i] = transition.Phase{Name: s.Name, What: s.What,
			Run:       func(ctx context.Context) error { return s.run(r, ctx) },
			OnFailure: func(_ context.Context, err error) { r.reportFailure(s, err) },
		}
	}
	tr := transition.Runner{Stage: "reset", Noun: "step", Log: r.log, Pause: r.d.Before,
		Settle: func(context.Context, transition.Phase) error { return r.sync() }}
	timings, err := tr.Run(ctx, phases)
	if pe, ok := errors.AsType[*transition.PhaseError](err); ok {
		err = &StepError{Step: pe.Phase, Err: pe.Err}
	}
	return timings, err
}

// runner carries one reset through its steps.
type runner struct {
	d    Deps
	rec  *ownership.Record
	lock *ownership.Lock
	log  *slog.Logger
	req  *requests.Request
	// reported: the request's Succeeded status is written.
	reported bool
}

// writeLine writes to w, ignoring errors (reports only).
func writeLine(w io.Writer, format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }

// isNotExist is errors.Is(err, fs.ErrNotExist).
func isNotExist(err error) bool { return errors.Is(err, os.ErrNotExist) }
