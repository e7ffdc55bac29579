package transition

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/testhooks"
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

// A check runs on every pass, a resume included (its name would be skipped),
// without save, pause, settle or timing, and a failing one stops the run
// through its failure hook; Chains leaves it out.
func TestCheck(t *testing.T) {
	r := &rec{}
	check := func(name string, err error) Phase { return r.phase(name, err).AsCheck() }
	table := []Phase{check("done-before", nil), r.phase("one", nil)}
	timings, err := r.runner(nil).Run(t.Context(), table)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"run done-before with state ", "save one", "pause one", "run one", "settle one"}
	if !slices.Equal(r.calls, want) {
		t.Errorf("calls\n%q\nwant\n%q", r.calls, want)
	}
	if len(timings) != 1 || timings[0].Name != "one" {
		t.Errorf("timings %+v, want only one", timings)
	}
	if c := Chains(table); len(c) != 1 || !slices.Equal(c[0], []string{"one"}) {
		t.Errorf("chains %q, want [[one]]", c)
	}
	boom := errors.New("boom")
	r = &rec{}
	_, err = r.runner(nil).Run(t.Context(), []Phase{check("versions", boom), r.phase("one", nil)})
	if pe, ok := errors.AsType[*PhaseError](err); !ok || pe.Phase != "versions" || !pe.Ran || !errors.Is(err, boom) {
		t.Fatalf("err %v", err)
	}
	if want := []string{"run versions with state ", "failed versions: boom"}; !slices.Equal(r.calls, want) {
		t.Errorf("calls\n%q\nwant\n%q", r.calls, want)
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

// TestEdges: a failure goes to its FailTo phase after OnFailure; a Last
// phase ends the run; From starts at a named phase; Timed sees every phase,
// the failed one with its error, and the returned timings only those that
// succeeded.
func TestEdges(t *testing.T) {
	r := &rec{}
	boom := errors.New("boom")
	ph := []Phase{r.phase("one", nil), r.phase("two", boom), r.phase("three", nil), r.phase("back", nil), r.phase("back-check", nil)}
	ph[1].FailTo = "back"
	ph[2].Last = true
	ph[4].Last = true
	ru := r.runner(nil)
	var timed []string
	ru.Timed = func(tm requests.PhaseTiming, err error) { timed = append(timed, fmt.Sprint(tm.Name, " ", err)) }
	timings, err := ru.Run(t.Context(), ph)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"save one", "pause one", "run one", "settle one", "save two", "pause two", "run two", "failed two: boom",
		"save back", "pause back", "run back", "settle back", "save back-check", "pause back-check", "run back-check", "settle back-check"}
	if !slices.Equal(r.calls, want) {
		t.Errorf("calls\n%q, want\n%q", r.calls, want)
	}
	if w := []string{"one <nil>", "two boom", "back <nil>", "back-check <nil>"}; !slices.Equal(timed, w) {
		t.Errorf("timed %q, want %q", timed, w)
	}
	if len(timings) != 3 {
		t.Errorf("timings %+v: want the three that succeeded", timings)
	}
	// A resume at three ends after it (Last).
	r.calls = nil
	ru.From = "three"
	if _, err := ru.Run(t.Context(), ph); err != nil || !slices.Equal(r.calls, []string{"save three", "pause three", "run three", "settle three"}) {
		t.Errorf("from three: %v, calls %q", err, r.calls)
	}
	ru.From = "nowhere"
	if _, err := ru.Run(t.Context(), ph); err == nil {
		t.Error("From naming no phase passes")
	}
	ru.From = ""
	ph[0].FailTo = "nowhere"
	if _, err := ru.Run(t.Context(), ph); err == nil {
		t.Error("FailTo naming no phase passes")
	}
	if got := Chains(ph[1:]); len(got) != 2 || !slices.Equal(got[0], []string{"two", "three"}) || !slices.Equal(got[1], []string{"back", "back-check"}) {
		t.Errorf("chains %q", got)
	}
}

// TestStopOnCancel: with StopOnCancel, a phase that fails while ctx is done
// stopped: no OnFailure, no FailTo, a Stopped *PhaseError; without, it
// failed.
func TestStopOnCancel(t *testing.T) {
	for _, stop := range []bool{true, false} {
		r := &rec{}
		ctx, cancel := context.WithCancel(t.Context())
		ph := []Phase{r.phase("one", nil), r.phase("back", nil)}
		ph[0].Run = func(context.Context) error { cancel(); return errors.New("killed") }
		ph[0].FailTo = "back"
		ru := r.runner(nil)
		ru.StopOnCancel = stop
		_, err := ru.Run(ctx, ph)
		pe, ok := errors.AsType[*PhaseError](err)
		if stop && (!ok || !pe.Stopped || pe.Phase != "one" || slices.Contains(r.calls, "save back")) {
			t.Errorf("stop on cancel: %v, calls %q", err, r.calls)
		}
		if !stop && (err != nil || !slices.Contains(r.calls, "save back")) {
			t.Errorf("no stop on cancel: %v, calls %q", err, r.calls)
		}
	}
}

func TestPauseAt(t *testing.T) {
	names := []string{"prepare", "switch"}
	if h, err := PauseAt("", "repave", names, nil); h != nil || err != nil {
		t.Fatalf("unset: hook %v, err %v", h != nil, err)
	}
	if _, err := PauseAt("nap", "repave", names, nil); err == nil || !strings.Contains(err.Error(), `KUBESLOT_TEST_PAUSE_AT="nap": not a repave phase (prepare, switch)`) {
		t.Fatalf("bad phase: %v", err)
	}
	var out bytes.Buffer
	h, err := PauseAt("switch", "repave", names, &out)
	if err != nil {
		t.Fatal(err)
	}
	if err := h(t.Context(), "prepare"); err != nil {
		t.Fatalf("another phase paused: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := h(ctx, "switch"); err == nil || out.String() != fmt.Sprintf("paused before switch (pid %d)\n", os.Getpid()) {
		t.Fatalf("switch: err %v, printed %q", err, out.String())
	}
}

// TestPauseFromEnv: the environment reaches the hook only in a build with
// the test hooks; a production build has none, whatever it is set to.
func TestPauseFromEnv(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == EnvPauseAt {
				return v
			}
			return ""
		}
	}
	names := []string{"prepare", "switch"}
	for _, v := range []string{"switch", "nap"} {
		h, err := PauseFromEnv(env(v), "repave", names, nil)
		if got := h != nil || err != nil; got != testhooks.Enabled {
			t.Errorf("%s=%s, test hooks %v: hook %v, err %v", EnvPauseAt, v, testhooks.Enabled, h != nil, err)
		}
	}
}
