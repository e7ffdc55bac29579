package watcher

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/cache"

	"github.com/kubeslot/kubeslot/lib/release"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

// An unusable request file (another kind's request, not JSON) never stops
// the watcher from reading the host root: its worker moves
// it aside; the watcher decides on everything else.
func TestInputsIgnoreUnusableRequests(t *testing.T) {
	root := testkit.Root(t)
	dir := requests.New(root)
	l := &loop{Options: Options{Root: root, Log: slog.New(slog.NewTextHandler(t.Output(), nil)), MachineName: "m", NodeName: "m"},
		dir: dir, store: state.NewStore(root),
		machine: cache.NewStore(cache.MetaNamespaceKeyFunc), node: cache.NewStore(cache.MetaNamespaceKeyFunc),
		ops: cache.NewStore(cache.MetaNamespaceKeyFunc)}
	rp, _ := dir.RequestPath(requests.Repave)
	if err := os.WriteFile(rp, []byte(`{"kind":"restart","id":"restart-4-op-x"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cp, _ := dir.ClaimedPath(requests.Upgrade)
	if err := os.WriteFile(cp, []byte("not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := dir.Write(&requests.Request{Kind: requests.Restart, ID: requests.NewID(requests.Restart, 2, "op"), Operation: "op"}); err != nil {
		t.Fatal(err)
	}
	in, err := l.inputs()
	if err != nil {
		t.Fatalf("inputs with unusable request files: %v", err)
	}
	if in.Pending[requests.Repave] != nil || in.Claimed[requests.Upgrade] != nil {
		t.Errorf("unusable requests taken as real: %+v %+v", in.Pending[requests.Repave], in.Claimed[requests.Upgrade])
	}
	if r := in.Pending[requests.Restart]; r == nil || r.ID != "restart-2-op" {
		t.Errorf("the good restart request is not seen: %+v", r)
	}
}

// A Succeeded verdict is never on disk without its probation: the file is
// written first, then the status, then the signal goes. The end of the
// probation moves last-good, then removes the file.
func TestVerdictProbationOnDisk(t *testing.T) {
	root := testkit.Root(t)
	dir := requests.New(root)
	l := &loop{Options: Options{Root: root, Log: slog.New(slog.NewTextHandler(t.Output(), nil)), Started: time.Now()}, dir: dir}
	for _, n := range []string{"blue", "green"} {
		d, _ := release.Dir(root, n)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := release.SetCurrent(root, "green"); err != nil {
		t.Fatal(err)
	}
	if err := release.SetLastGood(root, "blue"); err != nil {
		t.Fatal(err)
	}
	sig := signal()
	sig.Verified = true
	if err := dir.WriteUpgradeSignal(sig); err != nil {
		t.Fatal(err)
	}
	in := base(t)
	in.Upgrade, in.AgentVersion = sig, "v2"
	a := Decide(in)[0]
	// The probation cannot be written (its path is a directory): nothing else may be.
	pp, _ := dir.ProbationPath()
	if err := os.Mkdir(pp, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := l.finishUpgrade(a); err == nil {
		t.Fatal("verdict written without its probation")
	}
	if st, _ := dir.ReadStatus(sig.RequestID); st != nil {
		t.Fatalf("status %+v written without a probation", st)
	}
	if err := os.Remove(pp); err != nil {
		t.Fatal(err)
	}
	if err := l.finishUpgrade(a); err != nil {
		t.Fatal(err)
	}
	p, err := dir.ReadProbation()
	if err != nil || p == nil || p.ToRelease != "green" || p.SucceededAt.IsZero() {
		t.Fatalf("probation %+v %v", p, err)
	}
	if st, err := dir.ReadStatus(sig.RequestID); err != nil || st.Phase != requests.Succeeded {
		t.Fatalf("status %+v %v", st, err)
	}
	if s, _ := dir.ReadUpgradeSignal(); s != nil {
		t.Errorf("signal still there: %+v", s)
	}
	if err := l.endProbation(in, Action{Type: EndProbation, Probation: p, Advance: true}); err != nil {
		t.Fatal(err)
	}
	if lg, _ := release.LastGood(root); lg != "green" {
		t.Errorf("last-good %s after the probation, want green", lg)
	}
	if p, err := dir.ReadProbation(); p != nil || err != nil {
		t.Errorf("probation still there: %+v %v", p, err)
	}
}

// TestEntrySteps: a worker's step timings become the entry's steps, at most
// the schema's 16 (the last ones), with names the schema takes.
func TestEntrySteps(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 250_000_000, time.UTC)
	var ps []requests.PhaseTiming
	for i := range 30 {
		ps = append(ps, requests.PhaseTiming{Name: fmt.Sprintf("s%d", i), StartedAt: t0.Add(time.Duration(i) * time.Second), Duration: 1500 * time.Millisecond})
	}
	ps = append(ps, requests.PhaseTiming{Name: strings.Repeat("x", 64), StartedAt: t0})
	got := entrySteps(ps)
	if len(got) != 15 || got[0].Name != "s15" || got[14].Name != "s29" {
		t.Fatalf("steps %+v: want s15..s29 (the last 16, less the overlong name)", got)
	}
	if got[0].DurationMilliseconds != 1500 || !got[0].StartTime.Time.Equal(t0.Add(15*time.Second)) {
		t.Errorf("step %+v: want 1500 ms from %v (sub-second start kept)", got[0], t0.Add(15*time.Second))
	}
	if entrySteps(nil) != nil {
		t.Error("no timings: want no steps")
	}
}
