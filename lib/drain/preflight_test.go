package drain

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// app selects pods labelled app=v.
func app(v string) func(map[string]string) bool {
	return func(l map[string]string) bool { return l["app"] == v }
}

// TestPreflight: a budget that never allows a disruption, and one that
// allows fewer now than it has pods on the node, are named with their pods;
// under Refuse the drain fails before its cordon, evicting nothing; under
// Warn (the default) it says so and drains. Budgets of no pod here, and
// pods of DaemonSets, are left out. Budgets that cannot be read refuse
// under Refuse and are only logged under Warn.
func TestPreflight(t *testing.T) {
	setup := func() *fake {
		f := newFake(
			Pod{Namespace: "shop", Name: "db-0", UID: "1", Labels: map[string]string{"app": "db"}},
			Pod{Namespace: "shop", Name: "web-0", UID: "2", Labels: map[string]string{"app": "web"}},
			Pod{Namespace: "shop", Name: "web-1", UID: "3", Labels: map[string]string{"app": "web"}},
			Pod{Namespace: "shop", Name: "agent", UID: "4", Labels: map[string]string{"app": "db"}, DaemonSet: true},
		)
		f.pdbs = []PDB{
			{Namespace: "shop", Name: "db", Selects: app("db"), ExpectedPods: 1, DesiredHealthy: 1},
			{Namespace: "shop", Name: "web", Selects: app("web"), DisruptionsAllowed: 1, ExpectedPods: 3, DesiredHealthy: 2},
			{Namespace: "shop", Name: "other", Selects: app("other"), ExpectedPods: 1, DesiredHealthy: 1},
		}
		return f
	}
	t.Run("refuse", func(t *testing.T) {
		f := setup()
		var prog []Progress
		_, err := drainer(f, &prog).Drain(t.Context(), Policy{PDBPreflight: Refuse}, "repave-1-spec")
		pe, ok := errors.AsType[*PreflightError](err)
		if !ok || len(pe.Holds) != 2 || !strings.Contains(err.Error(), "shop/db never allows a disruption (1 of its 1 pods must stay healthy), covering shop/db-0") ||
			!strings.Contains(err.Error(), "shop/web allows 1 disruptions now, and this node has 2 of its pods: shop/web-0, shop/web-1") ||
			strings.Contains(err.Error(), "other") || !strings.Contains(err.Error(), "nothing cordoned") {
			t.Fatalf("err %v", err)
		}
		for _, c := range f.calls {
			if strings.HasPrefix(c, "patch") || strings.HasPrefix(c, "evict") {
				t.Errorf("refused drain called %q", c)
			}
		}
		if len(prog) == 0 || !prog[len(prog)-1].Done || prog[len(prog)-1].Outcome != Failed {
			t.Errorf("progress %+v", prog)
		}
	})
	t.Run("warn", func(t *testing.T) {
		f := setup()
		f.pdbs = f.pdbs[1:] // the web budget lets the drain through, one pod at a time
		f.pdbs[0].DisruptionsAllowed = 1
		var prog []Progress
		_, err := drainer(f, &prog).Drain(t.Context(), Policy{Timeout: time.Second}, "repave-1-spec")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(prog, func(p Progress) bool {
			return strings.Contains(p.Message, "will hold the drain up") && strings.Contains(p.Message, "shop/web")
		}) {
			t.Errorf("no warning in the progress: %+v", prog)
		}
		if got := f.evicted(); !slices.Equal(got, []string{"db-0", "web-0", "web-1"}) {
			t.Errorf("evicted %v", got)
		}
	})
	t.Run("unreadable", func(t *testing.T) {
		f := setup()
		f.pdbErr = errors.New("forbidden")
		var prog []Progress
		if _, err := drainer(f, &prog).Drain(t.Context(), Policy{PDBPreflight: Refuse}, "x"); err == nil || !strings.Contains(err.Error(), "could not be checked") {
			t.Errorf("Refuse, budgets unreadable: %v", err)
		}
		f = setup()
		f.pdbErr = errors.New("forbidden")
		f.pdbs = nil
		if _, err := drainer(f, &prog).Drain(t.Context(), Policy{Timeout: time.Second}, "x"); err != nil {
			t.Errorf("Warn, budgets unreadable: %v", err)
		}
	})
	if err := (Policy{PDBPreflight: "Maybe"}).Check(); err == nil || !strings.Contains(err.Error(), "disruption.pdbPreflight") {
		t.Errorf("Check: %v", err)
	}
}
