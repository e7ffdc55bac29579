package hostapi

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestExecRunner(t *testing.T) {
	ctx := t.Context()
	t.Setenv("KUBESLOT_LEAK_TEST", "1")
	out, err := ExecRunner{}.Run(ctx, "env")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(string(out)); !slices.Equal(got, DefaultEnv) {
		t.Errorf("command environment %q, want exactly %q", got, DefaultEnv)
	}
	if out, _ := (ExecRunner{Env: []string{"A=1"}}).Run(ctx, "env"); string(out) != "A=1\n" {
		t.Errorf("ExecRunner.Env ignored: %q", out)
	}

	out, err = ExecRunner{}.Run(ctx, "sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 3")
	if err == nil || !strings.Contains(err.Error(), "exit status 3") || !strings.Contains(err.Error(), "to-stderr") ||
		!strings.Contains(err.Error(), "sh -c") {
		t.Errorf("failure: %v", err)
	}
	if !strings.Contains(string(out), "to-stdout") {
		t.Errorf("output of a failed command not returned: %q", out)
	}

	tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if _, err := (ExecRunner{}).Run(tctx, "sleep", "30"); err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("deadline: %v", err)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Errorf("a command past its deadline ran for %v", d)
	}

	out, err = ExecRunner{}.Run(ctx, "head", "-c", fmt.Sprint(maxOutput+1000), "/dev/zero")
	if err != nil || len(out) != maxOutput {
		t.Errorf("output bound: %d bytes, %v", len(out), err)
	}
}

func TestTail(t *testing.T) {
	if got := Tail(nil, 10); got != "(none)" {
		t.Errorf("empty: %q", got)
	}
	if got := Tail([]byte("  abcdefghij\n"), 4); got != "...ghij" {
		t.Errorf("long: %q", got)
	}
}
