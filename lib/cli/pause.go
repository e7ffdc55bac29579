package cli

import (
	"context"
	"fmt"
	"os"
)

// EnvPauseAt names the test-only hook of the transition stages: the run stops
// at the start of that phase, prints "paused at <phase> (pid N)" and waits
// to be killed, so rig tests can kill -9 a stage in a known phase.
const EnvPauseAt = "KUBESLOT_TEST_PAUSE_AT"

// PauseHook reads EnvPauseAt for a stage whose phases are P (what names the
// stage in errors); it returns nil when the hook is not set, and an error
// naming the variable and value when valid refuses it.
func PauseHook[P ~string](getenv func(string) string, stdio IO, what string, valid func(P) bool) (func(context.Context, P) error, error) {
	at := P(getenv(EnvPauseAt))
	if at == "" {
		return nil, nil
	}
	if !valid(at) {
		return nil, fmt.Errorf("%s=%q: not a %s phase", EnvPauseAt, at, what)
	}
	return func(ctx context.Context, p P) error {
		if p != at {
			return nil
		}
		fmt.Fprintf(stdio.Stdout, "paused at %s (pid %d)\n", p, os.Getpid())
		<-ctx.Done()
		return fmt.Errorf("paused at %s: %w", p, context.Cause(ctx))
	}, nil
}
