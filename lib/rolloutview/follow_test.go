package rolloutview

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/watch"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// fakeCluster serves one operation and its Machines; each watch is a
// fake the test drives.
type fakeCluster struct {
	mu      sync.Mutex
	op      *v1alpha1.MachineOperation
	ms      []v1alpha1.Machine
	watches chan *watch.FakeWatcher
	lists   int
}

func (f *fakeCluster) GetOperation(context.Context, string) (*v1alpha1.MachineOperation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.op.DeepCopy(), nil
}

func (f *fakeCluster) ListMachines(_ context.Context, selector string) ([]v1alpha1.Machine, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists++
	if selector != "kubeslot.dev/enrolled=true,pool=web" {
		return nil, nil
	}
	return f.ms, nil
}

func (f *fakeCluster) set(op *v1alpha1.MachineOperation) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.op = op
}

func (f *fakeCluster) WatchOperation(context.Context, string, string) (watch.Interface, error) {
	w := watch.NewFake()
	f.watches <- w
	return w, nil
}

// TestFollow: a view on start and on each change; a watch the server ends
// is opened again; following ends at the outcome, and a deadline ends it
// with an error that says the operation was still running.
func TestFollow(t *testing.T) {
	op, ms := fixture()
	op.Status = v1alpha1.MachineOperationStatus{}
	f := &fakeCluster{op: op, ms: ms, watches: make(chan *watch.FakeWatcher, 4)}
	var seen []string
	done := make(chan error, 1)
	var last View
	go func() {
		var err error
		last, err = Follow(context.Background(), f, op.Name, FollowOptions{Refresh: time.Hour, Every: time.Nanosecond, Now: func() time.Time { return t0 }},
			func(v View) error { seen = append(seen, v.Summary()); return nil })
		done <- err
	}()
	w := <-f.watches
	next := op.DeepCopy()
	v1alpha1.SetMachineResult(next, v1alpha1.MachineOperationTarget{Name: "web-1", NodeName: "web-1", Phase: v1alpha1.OperationInProgress, StartTime: at(0)}, v1alpha1.CountAll)
	w.Modify(next.DeepCopy())
	f.set(next.DeepCopy())
	w.Stop() // the server ends the watch
	w = <-f.watches
	for _, n := range []string{"web-1", "web-2", "web-3", "web-4"} {
		v1alpha1.SetMachineResult(next, v1alpha1.MachineOperationTarget{Name: n, NodeName: n, Phase: v1alpha1.OperationSucceeded, StartTime: at(0), CompletionTime: at(5)}, v1alpha1.CountAll)
	}
	w.Modify(next.DeepCopy())
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if last.Outcome() != Succeeded || len(seen) < 3 || !strings.HasPrefix(seen[len(seen)-1], "Succeeded: 4 of 4") {
		t.Errorf("views %q, outcome %v", seen, last.Outcome())
	}
	if f.mu.Lock(); f.lists != 1 {
		t.Errorf("%d Lists of the Machines within the relist period, want 1", f.lists)
	}
	f.mu.Unlock()

	// Still running at the deadline.
	f.set(op)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := Follow(ctx, f, op.Name, FollowOptions{}, func(View) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "no outcome yet") {
		t.Errorf("followed past the deadline: %v", err)
	}
}

// TestFollowThrottled: changes closer together than Every show no view
// but the first and the one with the outcome.
func TestFollowThrottled(t *testing.T) {
	op, ms := fixture()
	op.Status = v1alpha1.MachineOperationStatus{}
	for _, n := range []string{"web-1", "web-2", "web-3", "web-4"} {
		v1alpha1.SetMachineResult(op, v1alpha1.MachineOperationTarget{Name: n, NodeName: n, Phase: v1alpha1.OperationWaiting}, v1alpha1.CountAll)
	}
	f := &fakeCluster{op: op, ms: ms, watches: make(chan *watch.FakeWatcher, 1)}
	shown := 0
	done := make(chan error, 1)
	go func() {
		_, err := Follow(context.Background(), f, op.Name, FollowOptions{Refresh: time.Hour, Every: time.Hour},
			func(View) error { shown++; return nil })
		done <- err
	}()
	w := <-f.watches
	next := op.DeepCopy()
	for _, n := range []string{"web-1", "web-2", "web-3", "web-4"} {
		v1alpha1.SetMachineResult(next, v1alpha1.MachineOperationTarget{Name: n, NodeName: n, Phase: v1alpha1.OperationSucceeded, StartTime: at(0), CompletionTime: at(5)}, v1alpha1.CountAll)
		w.Modify(next.DeepCopy())
	}
	if err := <-done; err != nil || shown != 2 {
		t.Errorf("%d views (%v), want 2: the first and the outcome", shown, err)
	}
}
