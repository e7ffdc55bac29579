package transition

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"
)

// rec runs a table of phases and records every callback in order.
type rec struct {
	calls []string
	// state is what Save made durable; each phase checks it names itself.
	state string
}

func (r *rec) phase(name string, fail error) Phase {
	return Phase{Name: name, What: "do " + name,
		Run: func(context.Context) error {
			if r.state != name {
				r.calls = append(r.calls, "run "+name+" with state "+r.state)
			} else {
				r.calls = append(r.calls, "run "+name)
			}
			return fail
		},
		OnFailure: func(_ context.Context, err error) { r.calls = append(r.calls, "failed "+name+": "+err.Error()) },
	}
}

func (r *rec) runner(log *slog.Logger) *Runner {
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	return &Runner{Stage: "test", Log: log,
		Skip: func(name string) bool { return name == "done-before" },
		Save: func(_ context.Context, p Phase) error {
			r.state = p.Name
			r.calls = append(r.calls, "save "+p.Name)
			return nil
		},
		Pause: func(_ context.Context, name string) error {
			r.calls = append(r.calls, "pause "+name)
			return nil
		},
		Settle: func(_ context.Context, p Phase) error {
			r.calls = append(r.calls, "settle "+p.Name)
			return nil
		},
		Now: func() time.Time { clock = clock.Add(time.Second); return clock },
	}
}

func TestOrderStateHookTimings(t *testing.T) {
	r := &rec{}
	var logs bytes.Buffer
	ph := []Phase{r.phase("done-before", nil), r.phase("one", nil), r.phase("two", nil)}
	timings, err := r.runner(slog.New(slog.NewTextHandler(&logs, nil))).Run(t.Context(), ph)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"save one", "pause one", "run one", "settle one", "save two", "pause two", "run two", "settle two"}
	if !slices.Equal(r.calls, want) {
		t.Errorf("calls\n%q\nwant\n%q", r.calls, want)
	}
	if len(timings) != 2 || timings[0].Name != "one" || timings[1].Name != "two" || timings[0].Duration != time.Second ||
		!timings[1].StartedAt.After(timings[0].StartedAt) {
		t.Errorf("timings %+v", timings)
	}
	for _, l := range []string{`msg="test phase started" phase=one`, `msg="test phase done" phase=one took=1s`, `msg="test phase done" phase=two`} {
		if !strings.Contains(logs.String(), l) {
			t.Errorf("log has no %q:\n%s", l, logs.String())
		}
	}
	if strings.Contains(logs.String(), "done-before") {
		t.Errorf("a skipped phase was logged:\n%s", logs.String())
	}
}

func TestFailure(t *testing.T) {
	boom := errors.New("boom")
	r := &rec{}
	timings, err := r.runner(nil).Run(t.Context(), []Phase{r.phase("one", nil), r.phase("two", boom), r.phase("three", nil)})
	var pe *PhaseError
	if !errors.As(err, &pe) || pe.Phase != "two" || !errors.Is(err, boom) || err.Error() != "phase two: boom" {
		t.Fatalf("err %v", err)
	}
	want := []string{"save one", "pause one", "run one", "settle one", "save two", "pause two", "run two", "failed two: boom"}
	if !slices.Equal(r.calls, want) {
		t.Errorf("calls\n%q\nwant\n%q", r.calls, want)
	}
	if len(timings) != 1 || timings[0].Name != "one" {
		t.Errorf("timings %+v, want only one", timings)
	}
}

// A failure to save, a pause and a failure to settle stop the run naming the
// phase, without the failure hook (the phase itself did not fail).
func TestHookFailures(t *testing.T) {
	boom := errors.New("boom")
	for _, where := range []string{"save", "pause", "settle"} {
		r := &rec{}
		run := r.runner(nil)
		switch where {
		case "save":
			run.Save = func(context.Context, Phase) error { return boom }
		case "pause":
			run.Pause = func(context.Context, string) error { return boom }
		case "settle":
			run.Settle = func(context.Context, Phase) error { return boom }
		}
		_, err := run.Run(t.Context(), []Phase{r.phase("one", nil)})
		var pe *PhaseError
		if !errors.As(err, &pe) || pe.Phase != "one" || !errors.Is(err, boom) {
			t.Errorf("%s: err %v", where, err)
		}
		for _, c := range r.calls {
			if strings.HasPrefix(c, "failed") || (where != "settle" && strings.HasPrefix(c, "run")) {
				t.Errorf("%s failed: calls %q", where, r.calls)
			}
		}
	}
}

func TestPauseHook(t *testing.T) {
	var paused []string
	h := PauseHook("two", func(name string) { paused = append(paused, name) })
	if err := h(t.Context(), "one"); err != nil || len(paused) != 0 {
		t.Fatalf("another phase paused: %v %v", err, paused)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := h(ctx, "two")
	if err == nil || !strings.Contains(err.Error(), "paused before two (KUBESLOT_TEST_PAUSE_AT)") || !slices.Equal(paused, []string{"two"}) {
		t.Fatalf("err %v, paused %v", err, paused)
	}
	// Through a runner: the phase is not run, and the error names it.
	r := &rec{}
	run := r.runner(nil)
	run.Pause = h
	if _, err := run.Run(ctx, []Phase{r.phase("one", nil), r.phase("two", nil)}); err == nil || err.Error() != "phase two: paused before two (KUBESLOT_TEST_PAUSE_AT): context canceled" {
		t.Errorf("err %v", err)
	}
	if slices.Contains(r.calls, "run two") {
		t.Errorf("the paused phase ran: %q", r.calls)
	}
}
