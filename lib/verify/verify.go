// Package verify checks, without changing anything, that a kubeslot
// installation holds what a healthy one holds: its unit files as the current
// release renders them, those units enabled and running, the current and
// last-good releases intact against their manifests, the applied
// configuration and its checksums, the active slot's node machine running,
// a node identity whose client certificate has not expired, and a
// configuration file that still describes the installation. Each check
// is a named Result (ok, problem with file, field and value, or skipped with
// why); the Report's verdict maps to the exit code of `kubeslot verify`.
//
// Read only, always: no lock is taken (a reader, like kubeslot status, needs
// none: every file it reads is replaced whole), nothing is written, repaired
// or started. The boot-time repair of what verify names is lib/bootstrap's
// (repair.go), which runs these checks and acts on their findings.
// Imported by cmd/kubeslot and lib/bootstrap.
package verify

import (
	"context"
	"fmt"
	"time"

	"github.com/kubeslot/kubeslot/lib/buildinfo"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

// Status is one check's outcome.
type Status string

// Check outcomes.
const (
	OK      Status = "ok"
	Problem Status = "problem"
	Skipped Status = "skipped"
)

// Verdicts of a whole report, and the exit codes of `kubeslot verify`.
const (
	VerdictOK           = "ok"
	VerdictProblems     = "problems"
	VerdictCannotVerify = "cannot-verify"

	// ExitProblems: at least one check found a problem (even if others
	// could not run).
	ExitProblems = 3
	// ExitCannotVerify: no problem found, but the installation could not
	// be checked whole: not installed, not complete, systemd unreachable.
	ExitCannotVerify = 4
)

// Check names, stable: scripts select results by them.
const (
	CheckInstallation = "installation"
	CheckApplied      = "applied"
	CheckCurrent      = "release-current"
	CheckLastGood     = "release-last-good"
	CheckUnitFiles    = "unit-files"
	CheckUnitsState   = "units-state"
	CheckMachine      = "machine"
	CheckIdentity     = "node-identity"
	CheckConfig       = "config"
)

// Finding is one thing wrong: the file (a host path, or a unit's or
// machine's name), which field of it, what was found and what a healthy
// installation has there. Values never hold a secret.
type Finding struct {
	File  string `json:"file"`
	Field string `json:"field"`
	Value string `json:"value"`
	Want  string `json:"want,omitempty"`
}

func (f Finding) String() string {
	s := fmt.Sprintf("%s: %s: %s", f.File, f.Field, f.Value)
	if f.Want != "" {
		s += " (want " + f.Want + ")"
	}
	return s
}

// Result is one named check.
type Result struct {
	Name   string `json:"name"`
	Status Status `json:"status"`
	// Detail: for ok, what was checked; for skipped, why not.
	Detail   string    `json:"detail,omitempty"`
	Findings []Finding `json:"findings,omitempty"`
}

// Report is what `kubeslot verify -o json` prints.
type Report struct {
	HostRoot string `json:"hostRoot"`
	Verdict  string `json:"verdict"`
	// CannotVerify says why parts could not be checked.
	CannotVerify []string `json:"cannotVerify,omitempty"`
	Checks       []Result `json:"checks"`
}

// ExitCode is the process exit code for the report's verdict.
func (r *Report) ExitCode() int {
	switch r.Verdict {
	case VerdictProblems:
		return ExitProblems
	case VerdictCannotVerify:
		return ExitCannotVerify
	}
	return 0
}

// Systemd is what verify asks the host's service manager and machined; the
// real one is lib/systemdconn.Client. Every call is bounded by ctx.
type Systemd interface {
	// UnitState returns the unit's ActiveState and SubState.
	UnitState(ctx context.Context, name string) (active, sub string, err error)
	// UnitFileState returns the unit's enablement ("enabled", ...).
	UnitFileState(ctx context.Context, name string) (string, error)
	// Machine asks machined about a machine (isolation.ErrNoMachine when
	// it has none).
	Machine(ctx context.Context, name string) (isolation.Machine, error)
}

// Deps is what Run needs.
type Deps struct {
	Root *hostroot.Root
	// Systemd, when nil, skips the checks that ask it, each saying
	// NoSystemd.
	Systemd   Systemd
	NoSystemd string
	// Now is the clock for the certificate's expiry; nil means time.Now.
	Now func() time.Time
	// Arch is the architecture releases must be for; "" means this
	// binary's.
	Arch string
	// ConfigFile is the host path of the configuration the bootstrap unit
	// runs with (DefaultConfigFile); "" skips the config check.
	ConfigFile string
}

// callTimeout bounds one systemd or machined call.
const callTimeout = 10 * time.Second

// Run runs every check and returns the report. It never changes the host.
func Run(ctx context.Context, d Deps) *Report {
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Arch == "" {
		d.Arch = buildinfo.Arch
	}
	r := &Report{HostRoot: d.Root.Base(), Checks: []Result{}}
	inst, why := checkInstallation(d.Root)
	r.Checks = append(r.Checks, inst)
	if why != "" {
		r.CannotVerify = append(r.CannotVerify, why)
	}
	if inst.Status != OK {
		for _, n := range []string{CheckApplied, CheckCurrent, CheckLastGood, CheckUnitFiles, CheckUnitsState, CheckMachine, CheckIdentity, CheckConfig} {
			r.Checks = append(r.Checks, Result{Name: n, Status: Skipped, Detail: "the installation check did not pass"})
		}
		r.finish()
		return r
	}
	applied, active := checkApplied(d.Root)
	r.Checks = append(r.Checks, applied,
		checkRelease(d.Root, CheckCurrent, hostroot.CurrentLink, d.Arch),
		checkRelease(d.Root, CheckLastGood, hostroot.LastGoodLink, d.Arch))
	files, rendered := checkUnitFiles(d.Root)
	r.Checks = append(r.Checks, files)
	if d.Systemd == nil {
		why := d.NoSystemd
		if why == "" {
			why = "no systemd to ask"
		}
		r.Checks = append(r.Checks, Result{Name: CheckUnitsState, Status: Skipped, Detail: why},
			Result{Name: CheckMachine, Status: Skipped, Detail: why})
	} else {
		units, err := checkUnitsState(ctx, d.Systemd, rendered)
		r.addLive(units, err)
		m, err := checkMachine(ctx, d.Root, d.Systemd, active)
		r.addLive(m, err)
	}
	r.Checks = append(r.Checks, checkIdentity(d.Root, d.Now()))
	if rec, err := ownership.Load(d.Root); err == nil && rec != nil {
		r.Checks = append(r.Checks, checkConfig(d.Root, d.ConfigFile, rec, active))
	}
	r.finish()
	return r
}

// addLive adds a check that asks systemd: an error reaching it makes the
// check skipped and the report unable to verify it, not a problem.
func (r *Report) addLive(res Result, err error) {
	if err != nil {
		res = Result{Name: res.Name, Status: Skipped, Detail: "systemd could not be asked: " + err.Error()}
		r.CannotVerify = append(r.CannotVerify, res.Name+": "+res.Detail)
	}
	r.Checks = append(r.Checks, res)
}

func (r *Report) finish() {
	r.Verdict = VerdictOK
	if len(r.CannotVerify) > 0 {
		r.Verdict = VerdictCannotVerify
	}
	for _, c := range r.Checks {
		if c.Status == Problem {
			r.Verdict = VerdictProblems
		}
	}
}

// result is a Result from findings: ok with detail when there are none.
func result(name string, findings []Finding, detail string) Result {
	if len(findings) > 0 {
		return Result{Name: name, Status: Problem, Findings: findings}
	}
	return Result{Name: name, Status: OK, Detail: detail}
}
