package watcher

// Which entries of an operation's status.machines this agent counts.
// Admission lets a node write any entry under its own node name (DESIGN.md,
// "Admission cost"), so an entry is counted only when its Machine exists
// with that node name and the operation targets it. For a machineRef
// operation that is the agent's own Machine, which it knows; for a selector
// operation the agent Lists the Machines the selector matches (the server
// filters by label) and keeps the names and node names per operation. It
// Lists again only when an entry appears that the last List did not
// account for, at most once per rollout poll: Machines rarely come and go,
// and a node name never changes. Nothing watches the Machines: an idle
// watcher holds no more than it did.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// targetBook holds, per selector operation, its targets as last Listed.
type targetBook struct {
	mu sync.Mutex
	// every is the least time between two Lists for one operation
	// that are not forced.
	every time.Duration
	ops   map[string]*targetList
}

type targetList struct {
	uid   types.UID
	nodes v1alpha1.TargetNodes
	// absent are the entry names the last List found no target for.
	absent map[string]bool
	at     time.Time
}

func newTargetBook(every time.Duration) *targetBook {
	return &targetBook{every: every, ops: map[string]*targetList{}}
}

// check is the entry check for op, read by the agent of Machine m (nil when
// it does not exist yet) on node: its own entry when op targets m, and for
// a selector operation the entries the last List vouches for.
func (b *targetBook) check(op *v1alpha1.MachineOperation, m *v1alpha1.Machine, node string) func(v1alpha1.MachineOperationTarget) bool {
	own := m != nil && m.Spec.NodeName == node
	if own {
		ok, err := op.Targets(m)
		own = ok && err == nil
	}
	mine := func(e v1alpha1.MachineOperationTarget) bool {
		return own && e.Name == m.Name && e.NodeName == node
	}
	if op.Spec.MachineSelector == nil {
		return mine // a machineRef operation has one target: this agent's own Machine or none
	}
	var nodes v1alpha1.TargetNodes
	b.mu.Lock()
	if t := b.ops[op.Name]; t != nil && t.uid == op.UID {
		nodes = t.nodes // replaced, never changed, by refresh
	}
	b.mu.Unlock()
	return func(e v1alpha1.MachineOperationTarget) bool { return mine(e) || nodes.Check(e) }
}

// count is how many Machines the last List of op found targeted (ok false
// before the first List).
func (b *targetBook) count(op *v1alpha1.MachineOperation) (int, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.ops[op.Name]
	if t == nil || t.uid != op.UID {
		return 0, false
	}
	return len(t.nodes), true
}

// holders says which node names may hold a slot of op: the nodes of the
// targets the last List found. A lease held by any other node is nobody's
// slot (lib/rollout).
func (b *targetBook) holders(op *v1alpha1.MachineOperation) func(string) bool {
	b.mu.Lock()
	var nodes v1alpha1.TargetNodes
	if t := b.ops[op.Name]; t != nil && t.uid == op.UID {
		nodes = t.nodes
	}
	b.mu.Unlock()
	set := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		set[n] = true
	}
	return func(node string) bool { return set[node] }
}

// unknown reports whether op has an entry the last List did not account
// for (or there was none), and when the next unforced List may run.
func (b *targetBook) unknown(op *v1alpha1.MachineOperation) (bool, time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.ops[op.Name]
	if t == nil || t.uid != op.UID {
		return true, time.Time{}
	}
	next := t.at.Add(b.every)
	for _, e := range op.Status.Machines {
		if _, ok := t.nodes[e.Name]; !ok && !t.absent[e.Name] {
			return true, next
		}
	}
	return false, next
}

// lister Lists the Machines a label selector matches.
type lister func(ctx context.Context, selector string) ([]v1alpha1.Machine, error)

// refresh Lists op's targets when an entry is unaccounted for, and no
// sooner than every after the last List unless force. It reports whether
// every entry is now accounted for.
func (b *targetBook) refresh(ctx context.Context, list lister, op *v1alpha1.MachineOperation, force bool, now time.Time) (bool, error) {
	if op.Spec.MachineSelector == nil {
		return true, nil
	}
	unknown, next := b.unknown(op)
	if !unknown {
		return true, nil
	}
	if !force && now.Before(next) {
		return false, nil
	}
	if _, err := b.list(ctx, list, op, now); err != nil {
		return false, err
	}
	return true, nil
}

// list Lists op's targets now and returns them.
func (b *targetBook) list(ctx context.Context, list lister, op *v1alpha1.MachineOperation, now time.Time) (v1alpha1.TargetNodes, error) {
	sel, err := op.Spec.MachineSelector.Selector()
	if err != nil {
		return nil, fmt.Errorf("MachineOperation %s: %w", op.Name, err)
	}
	ms, err := list(ctx, sel.String())
	if err != nil {
		return nil, fmt.Errorf("list the Machines of operation %s: %w", op.Name, err)
	}
	t := &targetList{uid: op.UID, nodes: v1alpha1.TargetNodesOf(op, ms), absent: map[string]bool{}, at: now}
	for _, e := range op.Status.Machines {
		if _, ok := t.nodes[e.Name]; !ok {
			t.absent[e.Name] = true
		}
	}
	b.mu.Lock()
	b.ops[op.Name] = t
	b.mu.Unlock()
	return t.nodes, nil
}

// keep forgets the operations not in ops (deleted, or created again under
// the same name).
func (b *targetBook) keep(ops []v1alpha1.MachineOperation) {
	live := make(map[string]types.UID, len(ops))
	for i := range ops {
		live[ops[i].Name] = ops[i].UID
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for name, t := range b.ops {
		if uid, ok := live[name]; !ok || uid != t.uid {
			delete(b.ops, name)
		}
	}
}

// listMachines Lists the Machines selector matches, the server filtering.
func (l *loop) listMachines(ctx context.Context, selector string) ([]v1alpha1.Machine, error) {
	list := &v1alpha1.MachineList{}
	err := l.mc.REST().Get().Resource(v1alpha1.MachinesResource).Param("labelSelector", selector).Do(ctx).Into(list)
	return list.Items, err
}
