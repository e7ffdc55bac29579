package drain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fake is a cluster of one Node: evicting a pod deletes it, unless a
// budget guards it; calls records what was asked, in order.
type fake struct {
	mu      sync.Mutex
	node    *Node
	rv      int
	pods    []Pod
	guarded map[string]string // pod name → blocking budget
	calls   []string
	nodeErr error // GetNode fails with it
	// linger keeps an evicted pod Terminating for that many lists.
	linger int
	gone   map[string]int
	// pdbs are the namespaces' budgets; pdbErr fails ListPDBs.
	pdbs   []PDB
	pdbErr error
}

func newFake(pods ...Pod) *fake {
	return &fake{node: &Node{}, pods: pods, guarded: map[string]string{}, gone: map[string]int{}}
}

func (f *fake) GetNode(ctx context.Context, name string) (*Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.nodeErr != nil {
		return nil, f.nodeErr
	}
	if f.node == nil {
		return nil, fmt.Errorf("Node %s: %w", name, ErrNodeNotFound)
	}
	n := *f.node
	n.ResourceVersion = fmt.Sprint(f.rv)
	return &n, nil
}

func (f *fake) PatchNode(ctx context.Context, name, rv string, unschedulable bool, by string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if rv != fmt.Sprint(f.rv) {
		return errors.New("conflict")
	}
	f.rv++
	f.node.Unschedulable, f.node.CordonedBy = unschedulable, by
	f.calls = append(f.calls, fmt.Sprintf("patch unschedulable=%v by=%q", unschedulable, by))
	return nil
}

func (f *fake) ListPods(ctx context.Context, node string) ([]Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Pod
	for _, p := range f.pods {
		if n, ok := f.gone[p.Name]; ok {
			if n <= 0 {
				continue
			}
			f.gone[p.Name] = n - 1
			p.Terminating = true
		}
		out = append(out, p)
	}
	return out, nil
}

func (f *fake) Evict(ctx context.Context, p Pod) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "evict "+p.Name)
	if pdb := f.guarded[p.Name]; pdb != "" {
		return &BlockedError{PDB: pdb, Message: "The disruption budget needs 1 healthy pods"}
	}
	if _, ok := f.gone[p.Name]; !ok {
		f.gone[p.Name] = f.linger
	}
	return nil
}

func (f *fake) ListPDBs(ctx context.Context, namespace string) ([]PDB, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []PDB
	for _, b := range f.pdbs {
		if b.Namespace == namespace {
			out = append(out, b)
		}
	}
	return out, f.pdbErr
}

func (f *fake) evicted() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.calls {
		if n, ok := strings.CutPrefix(c, "evict "); ok && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

func drainer(f *fake, progress *[]Progress) *Drainer {
	return &Drainer{Cluster: f, Node: "node1", Log: slog.New(slog.DiscardHandler), Poll: 2 * time.Millisecond,
		Progress: func(p Progress) { *progress = append(*progress, p) }}
}

func pods() []Pod {
	return []Pod{
		{Namespace: "default", Name: "web", UID: "1"},
		{Namespace: "kube-system", Name: "cni", UID: "2", DaemonSet: true},
		{Namespace: "kube-system", Name: "static", UID: "3", Mirror: true},
		{Namespace: "default", Name: "job", UID: "4", Finished: true},
		{Namespace: "default", Name: "cache", UID: "5", EmptyDir: true},
		{Namespace: "default", Name: "api", UID: "6"},
	}
}

// TestDrainEvictsWhatItShould: the Node is cordoned with the annotation,
// the pods are evicted except DaemonSet, mirror and finished ones, the
// drain waits for the evicted pods to go, and the last progress is Done.
func TestDrainEvictsWhatItShould(t *testing.T) {
	f := newFake(pods()...)
	f.linger = 3
	var prog []Progress
	res, err := drainer(f, &prog).Drain(context.Background(), Policy{Timeout: 5 * time.Second, DeleteEmptyDirData: true}, "repave-3-spec")
	if err != nil {
		t.Fatal(err)
	}
	if got := f.evicted(); !slices.Equal(got, []string{"api", "cache", "web"}) {
		t.Errorf("evicted %v, want api, cache, web", got)
	}
	if !f.node.Unschedulable || f.node.CordonedBy != "repave-3-spec" || f.calls[0] != `patch unschedulable=true by="repave-3-spec"` {
		t.Errorf("node %+v, calls %v", f.node, f.calls)
	}
	if res.Evicted != 3 || res.Forced || !prog[len(prog)-1].Done {
		t.Errorf("result %+v, progress %+v", res, prog)
	}
	if prog[0].PodsLeft != 3 {
		t.Errorf("first progress %+v, want 3 pods left", prog[0])
	}
}

// TestEmptyDirPolicy: without deleteEmptyDirData a pod with an emptyDir is
// never evicted: under Fail the drain fails at once, naming it, before any
// eviction; under Force the others are evicted and it is left.
func TestEmptyDirPolicy(t *testing.T) {
	f := newFake(pods()...)
	var prog []Progress
	_, err := drainer(f, &prog).Drain(context.Background(), Policy{Timeout: 5 * time.Second}, "r")
	if err == nil || !strings.Contains(err.Error(), "default/cache") || !strings.Contains(err.Error(), "deleteEmptyDirData") {
		t.Errorf("Fail: %v", err)
	}
	if got := f.evicted(); len(got) != 0 {
		t.Errorf("Fail: evicted %v before failing", got)
	}
	f = newFake(pods()...)
	res, err := drainer(f, &prog).Drain(context.Background(), Policy{Timeout: 5 * time.Second, OnTimeout: Force}, "r")
	if err != nil || !res.Forced || !slices.Equal(res.Left, []string{"default/cache"}) {
		t.Errorf("Force: %+v, %v", res, err)
	}
	if got := f.evicted(); !slices.Equal(got, []string{"api", "web"}) {
		t.Errorf("Force: evicted %v", got)
	}
}

// TestBudgetBlocksUntilTimeout: a pod a budget guards is retried (with
// backoff) and named in the progress; at the timeout Fail is an error
// naming the pod and the budget, Force goes on with the pod left.
func TestBudgetBlocksUntilTimeout(t *testing.T) {
	for _, action := range []Action{Fail, Force} {
		f := newFake(pods()[:2]...)
		f.guarded["web"] = "default/web-pdb"
		var prog []Progress
		t0 := time.Now()
		res, err := drainer(f, &prog).Drain(context.Background(), Policy{Timeout: 200 * time.Millisecond, OnTimeout: action}, "r")
		if took := time.Since(t0); took > 2*time.Second {
			t.Errorf("%s: took %s for a 200ms timeout", action, took)
		}
		n := strings.Count(strings.Join(f.calls, ";"), "evict web")
		if n < 2 || n > 40 {
			t.Errorf("%s: %d eviction attempts in 200ms, want retries with backoff", action, n)
		}
		if !slices.ContainsFunc(prog, func(p Progress) bool { return p.BlockingPDB == "default/web-pdb" && !p.Done && p.PodsLeft == 1 }) {
			t.Errorf("%s: no progress names the budget: %+v", action, prog)
		}
		switch action {
		case Fail:
			var te *TimeoutError
			if !errors.As(err, &te) || !strings.Contains(err.Error(), "default/web") || !strings.Contains(err.Error(), "PodDisruptionBudget default/web-pdb") {
				t.Errorf("Fail: %v", err)
			}
		case Force:
			if err != nil || !res.Forced || !slices.Equal(res.Left, []string{"default/web"}) || !strings.Contains(res.Message, "default/web-pdb") {
				t.Errorf("Force: %+v, %v", res, err)
			}
		}
	}
}

// TestCordonKeepsAPersonsCordon: a Node someone else cordoned is neither
// annotated nor uncordoned; kubeslot's own cordon is undone, once.
func TestCordonKeepsAPersonsCordon(t *testing.T) {
	f := newFake()
	f.node.Unschedulable = true
	var prog []Progress
	d := drainer(f, &prog)
	if _, err := d.Drain(context.Background(), Policy{Timeout: time.Second}, "r"); err != nil {
		t.Fatal(err)
	}
	if err := d.Uncordon(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !f.node.Unschedulable || f.node.CordonedBy != "" || len(f.calls) != 0 {
		t.Errorf("a person's cordon: node %+v, calls %v", f.node, f.calls)
	}
	f = newFake()
	d = drainer(f, &prog)
	for range 2 { // a resumed drain finds its own cordon
		if _, err := d.Drain(context.Background(), Policy{Timeout: time.Second}, "r"); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if err := d.Uncordon(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{`patch unschedulable=true by="r"`, `patch unschedulable=false by=""`}
	if !slices.Equal(f.calls, want) || f.node.Unschedulable {
		t.Errorf("calls %v, want %v; node %+v", f.calls, want, f.node)
	}
}

// TestNoClusterIsBounded: a node that cannot reach its Node fails within
// the timeout with the reason; with no Node at all there is nothing to do.
func TestNoClusterIsBounded(t *testing.T) {
	f := newFake()
	f.nodeErr = errors.New("dial tcp: connection refused")
	var prog []Progress
	t0 := time.Now()
	_, err := drainer(f, &prog).Drain(context.Background(), Policy{Timeout: 100 * time.Millisecond}, "r")
	if err == nil || !strings.Contains(err.Error(), "connection refused") || time.Since(t0) > 2*time.Second {
		t.Errorf("no cluster: %v after %s", err, time.Since(t0))
	}
	f = newFake()
	f.node = nil
	res, err := drainer(f, &prog).Drain(context.Background(), Policy{Timeout: time.Second}, "r")
	if err != nil || !res.NoNode {
		t.Errorf("no Node: %+v, %v", res, err)
	}
}

// TestPolicyBounds: a timeout out of bounds or an unknown action is refused, naming the field.
func TestPolicyBounds(t *testing.T) {
	for _, p := range []Policy{{Timeout: -time.Second}, {Timeout: MaxTimeout + time.Second}, {OnTimeout: "Maybe"}} {
		if err := p.Check(); err == nil || !strings.Contains(err.Error(), "disruption.") {
			t.Errorf("%+v: %v", p, err)
		}
	}
	if err := (Policy{Timeout: MaxTimeout, OnTimeout: Force}).Check(); err != nil {
		t.Error(err)
	}
}

// TestSkip: a policy that skips the drain touches neither the Node nor the pods.
func TestSkip(t *testing.T) {
	f := newFake(pods()...)
	var prog []Progress
	if _, err := drainer(f, &prog).Drain(context.Background(), Policy{Skip: true}, "r"); err != nil || len(f.calls) != 0 || len(prog) != 0 {
		t.Errorf("skip: %v, calls %v, progress %v", err, f.calls, prog)
	}
}
