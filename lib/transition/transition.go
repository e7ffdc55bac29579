// Package transition runs a stage as a table of named phases, so that every
// stage saves its state, pauses for tests, logs, times and reports its
// phases the same way (DESIGN.md, "State machines"; issue 18, item 1).
//
// A stage gives a list of Phase values (name, what it does, its run and an
// optional failure hook) and a Runner with the stage's callbacks; for each
// phase not yet done the Runner, in this order:
//
//  1. Save: makes the stage's durable state name the phase (bootstrap: its
//     checkpoint in the ownership record), so a process killed from here on
//     resumes this phase;
//  2. Pause: the one test hook, "pause before phase X"
//     (KUBESLOT_TEST_PAUSE_AT=X; PauseHook);
//  3. logs "<stage> <noun> started", runs the phase, then Settle (reset:
//     syncfs of what it touched), logs "<stage> <noun> done" with its
//     duration and records a requests.PhaseTiming.
//
// A failure anywhere in a phase stops the run with a *PhaseError naming the
// phase; only a failure of the phase's own run calls its OnFailure hook
// (first), never a failure to save, pause or settle.
//
// Imported by the stage packages (lib/reset, lib/bootstrap), never by cmd/
// or by a package a stage imports.
package transition

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/kubeslot/kubeslot/lib/requests"
)

// EnvPauseAt=<phase> is the test-only hook of every stage: the run stops
// before that phase (after the phases before it finished and its state is
// saved) and waits to be killed.
const EnvPauseAt = "KUBESLOT_TEST_PAUSE_AT"

// Phase is one named, idempotent phase of a stage.
type Phase struct {
	Name string
	// What says what the phase does, for messages.
	What string
	Run  func(ctx context.Context) error
	// OnFailure, if set, is called with Run's error before the run stops
	// (a stage reports the failure with it).
	OnFailure func(ctx context.Context, err error)
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
	// Now is the clock for timings (time.Now if nil).
	Now func() time.Time
}

// PhaseError is a phase that failed (or whose state could not be saved,
// whose test hook stopped the run, or whose settling failed).
type PhaseError struct {
	Phase string
	Err   error
}

func (e *PhaseError) Error() string { return fmt.Sprintf("phase %s: %v", e.Phase, e.Err) }

func (e *PhaseError) Unwrap() error { return e.Err }

func (r *Runner) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Run runs phases in order and returns the timing of each phase it ran,
// also when it stops at a failed one (a *PhaseError; the failed phase is not
// in the timings).
func (r *Runner) Run(ctx context.Context, phases []Phase) ([]requests.PhaseTiming, error) {
	noun := r.Noun
	if noun == "" {
		noun = "phase"
	}
	log := r.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var out []requests.PhaseTiming
	for _, p := range phases {
		if r.Skip != nil && r.Skip(p.Name) {
			continue
		}
		if r.Save != nil {
			if err := r.Save(ctx, p); err != nil {
				return out, &PhaseError{Phase: p.Name, Err: err}
			}
		}
		if r.Pause != nil {
			if err := r.Pause(ctx, p.Name); err != nil {
				return out, &PhaseError{Phase: p.Name, Err: err}
			}
		}
		t0 := r.now()
		log.Info(r.Stage+" "+noun+" started", noun, p.Name)
		if err := p.Run(ctx); err != nil {
			if p.OnFailure != nil {
				p.OnFailure(ctx, err)
			}
			return out, &PhaseError{Phase: p.Name, Err: err}
		}
		if r.Settle != nil {
			if err := r.Settle(ctx, p); err != nil {
				return out, &PhaseError{Phase: p.Name, Err: err}
			}
		}
		took := r.now().Sub(t0)
		out = append(out, requests.PhaseTiming{Name: p.Name, StartedAt: t0.UTC(), Duration: took})
		log.Info(r.Stage+" "+noun+" done", noun, p.Name, "took", took.Round(time.Millisecond))
	}
	return out, nil
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
