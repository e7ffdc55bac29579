package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

type phase string

func (p phase) valid() bool { return p == "prepare" || p == "switch" }

func TestPauseHook(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == EnvPauseAt {
				return v
			}
			return ""
		}
	}
	if h, err := PauseHook(env(""), IO{}, "repave", phase.valid); h != nil || err != nil {
		t.Fatalf("unset: hook %v, err %v", h != nil, err)
	}
	if _, err := PauseHook(env("nap"), IO{}, "repave", phase.valid); err == nil || !strings.Contains(err.Error(), `KUBESLOT_TEST_PAUSE_AT="nap": not a repave phase`) {
		t.Fatalf("bad phase: %v", err)
	}
	var out bytes.Buffer
	h, err := PauseHook(env("switch"), IO{Stdout: &out}, "repave", phase.valid)
	if err != nil {
		t.Fatal(err)
	}
	if err := h(context.Background(), "prepare"); err != nil {
		t.Fatalf("another phase paused: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := h(ctx, "switch"); err == nil || !strings.Contains(out.String(), "paused at switch") {
		t.Fatalf("switch: err %v, out %q", err, out.String())
	}
}
