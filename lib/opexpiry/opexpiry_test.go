package opexpiry

import (
	"context"
	"log/slog"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

type fakeCluster struct {
	ops      []v1alpha1.MachineOperation
	machines []v1alpha1.Machine
	deleted  []string
}

func (f *fakeCluster) ListOperations(context.Context) ([]v1alpha1.MachineOperation, error) {
	return f.ops, nil
}

func (f *fakeCluster) ListMachines(_ context.Context, selector string) ([]v1alpha1.Machine, error) {
	sel, err := labels.Parse(selector)
	if err != nil {
		return nil, err
	}
	var out []v1alpha1.Machine
	for _, m := range f.machines {
		if sel.Matches(labels.Set(m.Labels)) {
			out = append(out, m)
		}
	}
	return out, nil
}

func (f *fakeCluster) DeleteOperation(_ context.Context, name string, _ types.UID, _ string) error {
	f.deleted = append(f.deleted, name)
	return nil
}

func TestRun(t *testing.T) {
	now := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *metav1.Time { t := metav1.NewTime(now.Add(-d)); return &t }
	machine := func(name string, enrolled bool) v1alpha1.Machine {
		m := v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pool": "p"}}}
		if enrolled {
			m.Labels[v1alpha1.LabelEnrolled] = "true"
		}
		m.Spec.NodeName = "n-" + name
		return m
	}
	ttl := int32(60)
	selector := func(name string, entries ...v1alpha1.MachineOperationTarget) v1alpha1.MachineOperation {
		op := v1alpha1.MachineOperation{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(name)},
			Spec: v1alpha1.MachineOperationSpec{MachineSelector: &v1alpha1.MachineSelector{MatchLabels: map[string]string{"pool": "p"}},
				TTLSecondsAfterFinished: &ttl}}
		op.Status.Machines = entries
		// what nodes wrote: finished long ago, whatever the entries say
		op.Status.Phase, op.Status.CompletionTime = v1alpha1.OperationSucceeded, at(24*time.Hour)
		return op
	}
	done := func(name string, ago time.Duration) v1alpha1.MachineOperationTarget {
		return v1alpha1.MachineOperationTarget{Name: name, NodeName: "n-" + name, Phase: v1alpha1.OperationSucceeded, CompletionTime: at(ago)}
	}
	f := &fakeCluster{machines: []v1alpha1.Machine{machine("a", true), machine("b", true), machine("c", false)}}
	ref := v1alpha1.MachineOperation{ObjectMeta: metav1.ObjectMeta{Name: "ref", UID: "ref"},
		Spec: v1alpha1.MachineOperationSpec{MachineRef: &v1alpha1.MachineReference{Name: "a"}, TTLSecondsAfterFinished: &ttl}}
	ref.Status.Machines = []v1alpha1.MachineOperationTarget{done("a", 2*time.Minute)}
	f.ops = []v1alpha1.MachineOperation{
		selector("expired", done("a", 5*time.Minute), done("b", 2*time.Minute)),
		selector("recent", done("a", 5*time.Minute), done("b", 30*time.Second)),
		// b still runs: the forged summary says Succeeded, and an outsider's entry says so too
		selector("running", done("a", 5*time.Minute), v1alpha1.MachineOperationTarget{Name: "b", NodeName: "n-b", Phase: v1alpha1.OperationInProgress},
			v1alpha1.MachineOperationTarget{Name: "b", NodeName: "evil", Phase: v1alpha1.OperationSucceeded, CompletionTime: at(time.Hour)}),
		// only the outsider's entry and a Machine nobody enrolled
		selector("forged", v1alpha1.MachineOperationTarget{Name: "x", NodeName: "evil", Phase: v1alpha1.OperationSucceeded, CompletionTime: at(time.Hour)},
			done("c", time.Hour)),
		ref,
	}
	got, next, err := Run(context.Background(), f, now, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Name != "expired" || got[1].Name != "ref" || len(f.deleted) != 2 {
		t.Errorf("expired %+v, deleted %v; want expired and ref", got, f.deleted)
	}
	if want := now.Add(30 * time.Second); !next.Equal(want) {
		t.Errorf("next expiry %s, want %s (recent's)", next, want)
	}
}
