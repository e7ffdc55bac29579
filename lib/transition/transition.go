// Package transition runs a stage as a table of named phases, so that every
// stage saves its state, pauses for tests, logs, times and reports its
// phases the same way (DESIGN.md, "State machines").
//
// A stage gives a list of Phase values (name, what it does, its run, an
// optional failure hook, where a failure goes and whether the run ends
// after it) and a Runner with the stage's callbacks; for each phase not yet
// done the Runner, in this order:
//
//  1. Save: makes the stage's durable state name the phase (bootstrap: its
//     checkpoint in the ownership record; repave: state/repave.json and its
//     progress status), so a process killed from here on resumes this phase;
//  2. Pause: the one test hook, "pause before phase X"
//     (KUBESLOT_TEST_PAUSE_AT=X; PauseHook, PauseFromEnv; only in a build
//     with lib/testhooks' tag);
//  3. logs "<stage> <noun> started", runs the phase, then Settle (reset:
//     syncfs of what it touched), logs "<stage> <noun> done" (or "failed")
//     with its duration and records a requests.PhaseTiming (Timed).
//
// The phases run in table order from the first (or From) until one marked
// Last has run or the table ends. A Check phase (a precondition with no
// state of its own) is only run, on every pass, resumes included: its
// failure calls OnFailure and stops the run. A failure of a phase's own run calls its
// OnFailure hook and then goes to its FailTo phase (a rollback, itself a
// phase of the table), or stops the run with a *PhaseError naming the
// phase. With StopOnCancel, a failure while ctx is done is a stop rather
// than a failure (SIGTERM: resume at the next start): no OnFailure, no
// FailTo, and the *PhaseError says Stopped. A failure to save, pause or
// settle always stops the run.
//
// Imported by the stage packages (lib/reset, lib/bootstrap, lib/repave,
// lib/upgrade), lib/stagekit (the pause hook) and rig tests (EnvPauseAt),
// never by cmd/ or by a package a stage imports but the stage driver.
package transition

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/testhooks"
)

// EnvPauseAt=<phase> is the test-only hook of every stage: the run stops
// before that phase (after the phases before it finished and its state is
// saved) and waits to be killed. Only a build with lib/testhooks' tag reads
// it.
const EnvPauseAt = "KUBESLOT_TEST_PAUSE_AT"

// Phase is one named, idempotent phase of a stage.
type Phase struct {
	Name string
	// What says what the phase does, for messages.
	What string
	Run  func(ctx context.Context) error
	// OnFailure, if set, is called with Run's error before the run stops
	// or goes to FailTo (a stage reports or records the failure with it).
	OnFailure func(ctx context.Context, err error)
	// FailTo names the phase a failure of Run goes to (a rollback); empty
	// stops the run.
	FailTo string
	// Last ends the run after the phase succeeded (the end of a chain that
	// other phases of the table follow, such as a rollback).
	Last bool
	// Check marks a phase that holds no durable state of its own: a
	// precondition each run that reaches it makes again (the bootstrap's
	// version checks, whose kubelet pin lives in memory). It is never
	// skipped, saved, paused at or timed, and is not a state of the stage's
	// diagram (Chains leaves it out).
	Check bool
}

// FailingTo returns p whose failure calls report (if not nil) and then goes
// to the phase named to (a rollback), so a table says its edges in place.
func (p Phase) FailingTo(to string, report func(ctx context.Context, err error)) Phase {
	p.FailTo, p.OnFailure = to, report
	return p
}

// Final returns p that ends the run when it succeeds (Last).
func (p Phase) Final() Phase {
	p.Last = true
	return p
}

// AsCheck returns p as a Check.
func (p Phase) AsCheck() Phase {
	p.Check = true
	return p
}

// Runner runs a stage's phases. Every field is optional but Log.
type Runner struct {
	// Stage and Noun make the log messages: "<Stage> <Noun> started" and
	// "<Stage> <Noun> done", with the phase under the key Noun ("phase" if
	// empty).
	Stage, Noun string
	Log         *slog.Logger
	// Skip reports a phase an earlier run finished (a resume); it is not
	// run, saved, paused at or timed.
	Skip func(name string) bool
	// Save makes the stage's durable state name p before p starts.
	Save func(ctx context.Context, p Phase) error
	// Pause is the test hook, called before each phase after its state is
	// saved (PauseHook); an error stops the run there.
	Pause func(ctx context.Context, name string) error
	// Settle is called after a phase ran without error (reset: a syncfs of
	// what it touched); an error fails the phase.
	Settle func(ctx context.Context, p Phase) error
	// Timed, if set, is told each phase's timing as the phase ends, with
	// its error (a stage that keeps timings in its durable state, failed
	// phases included).
	Timed func(t requests.PhaseTiming, err error)
	// From names the phase to start at (a resume); empty: the first.
	From string
	// StopOnCancel: a phase that fails while ctx is done stopped, to be
	// resumed (SIGTERM), rather than failed.
	StopOnCancel bool
	// Now is the clock for timings (time.Now if nil).
	Now func() time.Time
}

// PhaseError is a phase that failed (or whose state could not be saved,
// whose test hook stopped the run, or whose settling failed).
type PhaseError struct {
	Phase string
	Err   error
	// Stopped: the run was told to stop (ctx done with StopOnCancel, or
	// the test hook), nothing failed; the stage resumes the phase.
	Stopped bool
	// Ran: the phase's own run failed, not its save, pause or settle.
	Ran bool
}

func (e *PhaseError) Error() string { return fmt.Sprintf("phase %s: %v", e.Phase, e.Err) }

func (e *PhaseError) Unwrap() error { return e.Err }

func (r *Runner) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Run runs phases from the first (or From) and returns the timing of each
// phase that succeeded, also when it stops (a *PhaseError).
func (r *Runner) Run(ctx context.Context, phases []Phase) ([]requests.PhaseTiming, error) {
	noun := r.Noun
	if noun == "" {
		noun = "phase"
	}
	log := r.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	index := make(map[string]int, len(phases))
	for i, p := range phases {
		index[p.Name] = i
	}
	for _, p := range phases {
		if _, ok := index[p.FailTo]; p.FailTo != "" && !ok {
			return nil, fmt.Errorf("%s phase %s: FailTo names no phase (%q)", r.Stage, p.Name, p.FailTo)
		}
	}
	i := 0
	if r.From != "" {
		var ok bool
		if i, ok = index[r.From]; !ok {
			return nil, fmt.Errorf("%s: no phase %q to start at", r.Stage, r.From)
		}
	}
	var out []requests.PhaseTiming
	for i < len(phases) {
		p := phases[i]
		next := i + 1
		if p.Last {
			next = len(phases)
		}
		if !p.Check && r.Skip != nil && r.Skip(p.Name) {
			i = next
			continue
		}
		if p.Check {
			if err := p.Run(ctx); err != nil {
				log.Warn(r.Stage+" check failed", "check", p.Name, "err", err)
				if p.OnFailure != nil {
					p.OnFailure(ctx, err)
				}
				return out, &PhaseError{Phase: p.Name, Err: err, Ran: true}
			}
			i = next
			continue
		}
		if r.Save != nil {
			if err := r.Save(ctx, p); err != nil {
				return out, &PhaseError{Phase: p.Name, Err: err}
			}
		}
		if r.Pause != nil {
			if err := r.Pause(ctx, p.Name); err != nil {
				return out, &PhaseError{Phase: p.Name, Err: err, Stopped: true}
			}
		}
		t0 := r.now()
		log.Info(r.Stage+" "+noun+" started", noun, p.Name)
		err := p.Run(ctx)
		if err == nil && r.Settle != nil {
			if err := r.Settle(ctx, p); err != nil {
				return out, &PhaseError{Phase: p.Name, Err: err}
			}
		}
		took := r.now().Sub(t0)
		timing := requests.PhaseTiming{Name: p.Name, StartedAt: t0.UTC(), Duration: took}
		if err != nil {
			if r.Timed != nil {
				r.Timed(timing, err)
			}
			stopped := r.StopOnCancel && ctx.Err() != nil
			log.Warn(r.Stage+" "+noun+" failed", noun, p.Name, "took", took.Round(time.Millisecond), "stopped", stopped, "err", err)
			if stopped {
				return out, &PhaseError{Phase: p.Name, Err: err, Stopped: true, Ran: true}
			}
			if p.OnFailure != nil {
				p.OnFailure(ctx, err)
			}
			if p.FailTo == "" {
				return out, &PhaseError{Phase: p.Name, Err: err, Ran: true}
			}
			i = index[p.FailTo]
			continue
		}
		out = append(out, timing)
		if r.Timed != nil {
			r.Timed(timing, nil)
		}
		log.Info(r.Stage+" "+noun+" done", noun, p.Name, "took", took.Round(time.Millisecond))
		i = next
	}
	return out, nil
}

// Chains lists the names of a table's chains, as DESIGN.md's diagrams draw
// them: from the first phase in order up to the first Last one (or the
// end), then from each FailTo target not on a chain yet.
func Chains(phases []Phase) [][]string {
	on := map[string]bool{}
	chain := func(from int) []string {
		var c []string
		for i := from; i < len(phases); i++ {
			if phases[i].Check {
				continue
			}
			c = append(c, phases[i].Name)
			on[phases[i].Name] = true
			if phases[i].Last {
				break
			}
		}
		return c
	}
	if len(phases) == 0 {
		return nil
	}
	out := [][]string{chain(0)}
	for _, p := range phases {
		if p.FailTo == "" || on[p.FailTo] {
			continue
		}
		for i, q := range phases {
			if q.Name == p.FailTo {
				out = append(out, chain(i))
			}
		}
	}
	return out
}

// PauseHook returns a Runner.Pause for EnvPauseAt=at: before phase at it
// calls paused (which prints the line a rig test waits for), then waits
// until ctx ends (the test kills the process) and returns an error naming
// the phase. Other phases pass.
func PauseHook(at string, paused func(name string)) func(ctx context.Context, name string) error {
	return func(ctx context.Context, name string) error {
		if name != at {
			return nil
		}
		if paused != nil {
			paused(name)
		}
		<-ctx.Done()
		return fmt.Errorf("paused before %s (%s): %w", name, EnvPauseAt, context.Cause(ctx))
	}
}

// PauseFromEnv reads EnvPauseAt through getenv for a stage whose pausable
// phases are names (PauseAt); nil in a build without the test hooks
// (lib/testhooks), whatever the environment says. Every stage reads the
// hook here (lib/stagekit), so it means the same in each.
func PauseFromEnv(getenv func(string) string, stage string, names []string, w io.Writer) (func(ctx context.Context, name string) error, error) {
	if !testhooks.Enabled {
		return nil, nil
	}
	return PauseAt(getenv(EnvPauseAt), stage, names, w)
}

// PauseAt is the hook EnvPauseAt=at makes for a stage whose pausable phases
// are names: nil when at is empty, an error naming them when it is none of
// them, else PauseHook(at, ...) that first prints "paused before <phase>
// (pid N)" to w, the line rig tests wait for before they kill the process.
func PauseAt(at, stage string, names []string, w io.Writer) (func(ctx context.Context, name string) error, error) {
	if at == "" {
		return nil, nil
	}
	if !slices.Contains(names, at) {
		return nil, fmt.Errorf("%s=%q: not a %s phase (%s)", EnvPauseAt, at, stage, strings.Join(names, ", "))
	}
	return PauseHook(at, func(name string) {
		if w != nil {
			fmt.Fprintf(w, "paused before %s (pid %d)\n", name, os.Getpid())
		}
	}), nil
}
