package sdtest

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
)

func TestSystemd(t *testing.T) {
	ctx := t.Context()
	f := New(func(unit string) string {
		if m, ok := strings.CutPrefix(unit, "node@"); ok {
			return strings.TrimSuffix(m, ".service")
		}
		return ""
	})
	if a, s, _ := f.UnitState(ctx, "node@a.service"); a != "inactive" || s != "dead" {
		t.Errorf("unknown unit: %s/%s", a, s)
	}
	if err := f.StartUnit(ctx, "node@a.service"); err != nil {
		t.Fatal(err)
	}
	if m, err := f.Machine(ctx, "a"); err != nil || m.Service != "node@a.service" || m.State != "running" {
		t.Errorf("machine after start: %+v, %v", m, err)
	}
	_ = f.StartUnit(ctx, "other.service")
	if len(f.Machines) != 1 {
		t.Errorf("machines %v: want a's only", f.Machines)
	}
	if l, _ := f.ListUnitsByPatterns(ctx, []string{"node@*.service"}); !slices.Equal(l, []string{"node@a.service"}) {
		t.Errorf("listed %v", l)
	}
	_ = f.TerminateMachine(ctx, "a")
	if _, err := f.Machine(ctx, "a"); !errors.Is(err, hostapi.ErrNoMachine) {
		t.Errorf("machine after terminate: %v", err)
	}
	if st, _ := f.ServiceStatus(ctx, "node@a.service"); st.ActiveState != "failed" {
		t.Errorf("unit after terminate: %+v", st)
	}
	_ = f.Reload(ctx)
	_ = f.StopUnit(ctx, "other.service")
	want := []string{"start node@a.service", "start other.service", "list [node@*.service]", "terminate a", "reload", "stop other.service"}
	if got := f.Calls(); !slices.Equal(got, want) || f.Reloads != 1 {
		t.Errorf("calls %q, %d reloads; want %q, 1", got, f.Reloads, want)
	}
	// A failing call is recorded and changes nothing; forgotten calls are gone.
	f.ForgetCalls()
	injected := errors.New("job failed")
	f.Fail = map[string]error{"stop node@a.service": injected, "list [x]": injected}
	_ = f.StartUnit(ctx, "node@a.service")
	if err := f.StopUnit(ctx, "node@a.service"); !errors.Is(err, injected) {
		t.Errorf("stop: %v, want the injected error", err)
	}
	if _, err := f.Machine(ctx, "a"); err != nil {
		t.Errorf("a failed stop removed the machine: %v", err)
	}
	if _, err := f.ListUnitsByPatterns(ctx, []string{"x"}); !errors.Is(err, injected) {
		t.Errorf("list: %v, want the injected error", err)
	}
	if got, want := f.Calls(), []string{"start node@a.service", "stop node@a.service", "list [x]"}; !slices.Equal(got, want) {
		t.Errorf("calls %q, want %q", got, want)
	}
}
