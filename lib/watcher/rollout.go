package watcher

// The watcher's part of a paced rollout (spec.rollout of a selector
// operation; lib/rollout holds the slots). Decide, pure, turns each rollout
// operation that targets this Machine into one slot action: AwaitSlot until
// the request is written (report a Waiting entry, try for a slot when the
// gate lets this agent), KeepSlot while the request runs, ReleaseSlot once
// the result is in the operation's status. The request is written only
// while a slot is held (Inputs.Slots). Nothing about a slot is kept on
// disk: a restarted watcher finds its slot from the lease itself.

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/rollout"
)

// Slot action types.
const (
	// AwaitSlot reports Action.Operation's Waiting entry (Action.Gate's
	// message) and, when the gate allows, tries to take a slot; a slot held
	// while the gate is shut (paused, halted) is given back.
	AwaitSlot ActionType = "AwaitSlot"
	// KeepSlot makes sure the slot of a dispatched operation is renewed
	// (a restarted watcher finds it on the server).
	KeepSlot ActionType = "KeepSlot"
	// ReleaseSlot gives the slot back once the result is published.
	ReleaseSlot ActionType = "ReleaseSlot"
)

// slotGate is what a rollout lets this agent do now.
type slotGate struct {
	// Try: this agent may take a slot now, one of Slots. Stop: nobody may
	// start (halted, paused, a bad spec); a slot held goes back.
	Try, Stop bool
	Slots     int
	// Message is the Waiting entry's message.
	Message string
	// CountTargets: maxUnavailable is a percentage and status.targets is
	// not set yet; the agent counts the Machines the selector matches and
	// sets it with its entry.
	CountTargets bool
	// OrderKey is this Machine's value of spec.rollout.orderByLabel.
	OrderKey string
	// JoinWait is how long an ordered rollout still waits for targets that
	// have not reported yet (decide again then).
	JoinWait time.Duration
}

// joinWindow bounds how long an ordered rollout waits, from the
// operation's creation, for every target to report its place in line: a
// target whose agent is down must not hold the rollout forever.
const joinWindow = 2 * time.Minute

// paced reports whether op is a rollout (a selector operation with
// spec.rollout).
func paced(op *v1alpha1.MachineOperation) bool {
	return op.Spec.Rollout != nil && op.Spec.MachineSelector != nil
}

// rolloutGate decides, from the operation's status alone, whether the agent
// of Machine m on node may try for a slot: not when the failure budget is
// spent, when paused, or (with an order or a canary) when other waiting
// targets come first.
func rolloutGate(op *v1alpha1.MachineOperation, m *v1alpha1.Machine, node string, now time.Time) slotGate {
	r := op.Spec.Rollout
	g := slotGate{}
	ordered := r.OrderByLabel != "" || r.Canary > 0
	if r.OrderByLabel != "" {
		g.OrderKey = m.Labels[r.OrderByLabel]
	}
	var failed, succeeded []string
	type waiter struct{ key, name string }
	var waiting []waiter
	me := false
	for _, e := range op.Status.Machines {
		switch e.Phase {
		case v1alpha1.OperationFailed:
			failed = append(failed, e.Name)
		case v1alpha1.OperationSucceeded:
			succeeded = append(succeeded, e.Name)
		case v1alpha1.OperationWaiting:
			if e.Name == m.Name && e.NodeName == node {
				me = true
				e.OrderKey = g.OrderKey
			}
			waiting = append(waiting, waiter{e.OrderKey, e.Name})
		}
	}
	if !me {
		waiting = append(waiting, waiter{g.OrderKey, m.Name})
	}
	switch {
	case r.BudgetSpent(len(failed)):
		g.Stop = true
		g.Message = fmt.Sprintf("halted: %d failed (%v), spec.rollout.failureBudget is %d", len(failed), failed, r.Budget())
		return g
	case r.Paused:
		g.Stop = true
		g.Message = "paused: spec.rollout.paused is true"
		return g
	case (r.Percent() || ordered) && op.Status.Targets == 0:
		g.CountTargets = true
		g.Message = "counting the targets of the rollout"
		return g
	}
	slots, err := r.Slots(int(op.Status.Targets))
	if err != nil {
		g.Stop = true
		g.Message = "refused: " + err.Error()
		return g
	}
	canary := len(succeeded) < int(r.Canary)
	if canary {
		slots = 1
	}
	g.Slots = slots
	if !ordered {
		g.Try = true
		g.Message = fmt.Sprintf("waiting for one of %d rollout slots", slots)
		return g
	}
	// The line is known once every target has reported (or the window
	// is over): before, a target late to report could be passed over.
	if left := op.CreationTimestamp.Add(joinWindow).Sub(now); len(op.Status.Machines) < int(op.Status.Targets) && left > 0 {
		g.JoinWait = left
		g.Message = fmt.Sprintf("waiting for all %d targets to report before the ordered rollout starts", op.Status.Targets)
		return g
	}
	slices.SortFunc(waiting, func(a, b waiter) int { return cmp.Or(cmp.Compare(a.key, b.key), cmp.Compare(a.name, b.name)) })
	pos := slices.IndexFunc(waiting, func(w waiter) bool { return w.name == m.Name })
	g.Try = pos < slots
	// The message does not say the place in line: every waiting agent would
	// rewrite its entry each time the line moves.
	g.Message = fmt.Sprintf("waiting in order for one of %d rollout slots", slots)
	if canary {
		g.Message = fmt.Sprintf("waiting in order for the canary slot (%d canaries first)", r.Canary)
	}
	return g
}

// slotAction is the slot action for rollout operation op on Machine m (ok
// false: none), and whether Decide may write op's request now: only with a
// slot held and the gate not shut. dispatched says a request of op is on
// disk already; wouldRequest that Decide would write one.
func slotAction(in Inputs, op *v1alpha1.MachineOperation, m *v1alpha1.Machine, dispatched, wouldRequest bool) (a Action, ok, write bool) {
	held := in.Slots[op.Name]
	e := op.Status.Target(m.Name, in.NodeName)
	switch {
	case e != nil && e.Phase.Finished():
		return Action{Type: ReleaseSlot, Operation: op}, true, false
	case dispatched:
		return Action{Type: KeepSlot, Operation: op}, true, false
	case !wouldRequest:
		// Not targeted, paused Machine, invalid spec: nothing to wait
		// for; a slot taken for it goes back.
		return Action{Type: ReleaseSlot, Operation: op}, held, false
	}
	g := rolloutGate(op, m, in.NodeName, in.Now)
	if held && !g.Stop {
		return Action{}, false, true
	}
	return Action{Type: AwaitSlot, Operation: op, Gate: &g}, true, false
}

// awaitSlot carries out AwaitSlot: the Waiting entry, then an attempt.
func (l *loop) awaitSlot(ctx context.Context, a Action) error {
	op, g := a.Operation, a.Gate
	held, err := l.slots.Recover(ctx, slotOwner(op))
	if err != nil {
		return err
	}
	if err := l.reportWaiting(ctx, op, g); err != nil {
		return err
	}
	if held && g.Stop {
		return l.slots.Release(ctx, slotOwner(op))
	}
	if g.JoinWait > 0 {
		l.nudgeIn(g.JoinWait)
	}
	if !g.Try || held {
		return nil
	}
	ok, wait, err := l.slots.Try(ctx, slotOwner(op), g.Slots)
	if err != nil {
		return err
	}
	if !ok {
		l.nudgeIn(wait)
		return nil
	}
	// The budget, the pause and the order again, from the server: this
	// watcher's copy may not have seen the failure of the agent whose slot
	// it just took.
	fresh, err := l.mc.GetOperation(ctx, op.Name)
	if err != nil {
		return err
	}
	if g2 := rolloutGate(fresh, l.machineOrEmpty(), l.NodeName, time.Now()); g2.Stop {
		l.Log.Info("gave the rollout slot back: the operation says wait", "operation", op.Name, "why", g2.Message)
		return l.slots.Release(ctx, slotOwner(op))
	}
	l.nudge()
	return nil
}

// slotOwner names op's slots: by name and UID, so the leases of an earlier
// operation of the same name are not taken for this one's.
func slotOwner(op *v1alpha1.MachineOperation) rollout.Owner {
	return rollout.Owner{Name: op.Name, UID: op.UID}
}

func (l *loop) machineOrEmpty() *v1alpha1.Machine {
	if obj, ok, _ := l.machine.GetByKey(l.MachineName); ok {
		return obj.(*v1alpha1.Machine)
	}
	return &v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: l.MachineName}}
}

// reportWaiting writes this Machine's Waiting entry when it differs from
// the one there (and status.targets when the gate asks for the count).
func (l *loop) reportWaiting(ctx context.Context, op *v1alpha1.MachineOperation, g *slotGate) error {
	e := v1alpha1.MachineOperationTarget{Name: l.MachineName, NodeName: l.NodeName, Phase: v1alpha1.OperationWaiting,
		Message: g.Message, OrderKey: g.OrderKey}
	same := func(cur *v1alpha1.MachineOperationTarget) bool {
		return cur != nil && cur.Phase == e.Phase && cur.Message == e.Message && cur.OrderKey == e.OrderKey
	}
	if same(op.Status.Target(e.Name, e.NodeName)) && !g.CountTargets {
		return nil
	}
	var targets int32
	if g.CountTargets {
		n, err := l.countTargets(ctx, op)
		if err != nil {
			return err
		}
		targets = n
	}
	_, err := l.mc.UpdateOperationStatus(ctx, op.Name, func(cur *v1alpha1.MachineOperation) error {
		if c := cur.Status.Target(e.Name, e.NodeName); c != nil && c.Phase != v1alpha1.OperationWaiting {
			return errNoChange // dispatched meanwhile (another pass)
		}
		setTargets := targets > 0 && cur.Status.Targets == 0
		if same(cur.Status.Target(e.Name, e.NodeName)) && !setTargets {
			return errNoChange
		}
		if setTargets {
			cur.Status.Targets = targets
		}
		v1alpha1.SetMachineResult(cur, e)
		return nil
	})
	if err == nil && g.CountTargets {
		l.nudge() // the slots can be counted now
	}
	return err
}

// countTargets counts the Machines op's selector matches (one List, the
// server filtering by label).
func (l *loop) countTargets(ctx context.Context, op *v1alpha1.MachineOperation) (int32, error) {
	sel, err := op.Spec.MachineSelector.Selector()
	if err != nil {
		return 0, err
	}
	list := &v1alpha1.MachineList{}
	err = l.mc.REST().Get().Resource(v1alpha1.MachinesResource).Param("labelSelector", sel.String()).Do(ctx).Into(list)
	if err != nil {
		return 0, fmt.Errorf("count the Machines of operation %s: %w", op.Name, err)
	}
	return int32(len(list.Items)), nil
}

// nudgeIn decides again after d (one timer: the earliest wins).
func (l *loop) nudgeIn(d time.Duration) {
	due := time.Now().Add(d)
	if l.slotTimer != nil && !l.slotDue.After(due) && l.slotDue.After(time.Now()) {
		return
	}
	if l.slotTimer != nil {
		l.slotTimer.Stop()
	}
	l.slotDue = due
	l.slotTimer = time.AfterFunc(d, l.nudge)
}
