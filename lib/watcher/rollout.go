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
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/requests"
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
	// SoakSlot keeps the slot of a target that succeeded until
	// Action.Until (spec.rollout.soakSeconds), then decides again: the
	// next target starts only after the soak.
	SoakSlot ActionType = "SoakSlot"
)

// slotGate is what a rollout lets this agent do now.
type slotGate struct {
	// Try: this agent may take a slot now, one of Slots. Stop: nobody may
	// start (halted, paused, a bad spec); a slot held goes back.
	Try, Stop bool
	Slots     int
	// Message is the Waiting entry's message.
	Message string
	// CountTargets: maxUnavailable is a percentage, or the rollout is
	// ordered, and this agent has not Listed the targets yet: it Lists
	// them before it decides (and shows the count in status.targets).
	CountTargets bool
	// OrderKey is this Machine's value of spec.rollout.orderByLabel.
	OrderKey string
	// Recheck is when the gate may change with time alone: an ordered
	// rollout's wait for targets that have not reported yet, or a
	// canary's soak (decide again then).
	Recheck time.Duration
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

// rolloutGate decides whether the agent of Machine m on node may try for a
// slot: not while stop says the rollouts are stopped (a RolloutStop
// exists), when the failure budget is spent, when paused, outside the
// maintenance windows of op or m (windows.go), or (with an
// order or a canary) when other waiting targets come first. It counts only
// the entries check passes (targets.go), and takes the number of targets
// from this agent's own List (targets, 0 when not Listed yet), never from
// status.targets: an entry or a summary any node can write must not halt,
// order, size or pass a rollout.
func rolloutGate(op *v1alpha1.MachineOperation, m *v1alpha1.Machine, node string, now time.Time, check func(v1alpha1.MachineOperationTarget) bool, targets int, stop string) slotGate {
	r := op.Spec.Rollout
	g := slotGate{}
	ordered := r.OrderByLabel != "" || r.Canary > 0
	if r.OrderByLabel != "" {
		g.OrderKey = m.Labels[r.OrderByLabel]
	}
	var failed, succeeded []string
	var soaking time.Duration
	type waiter struct{ key, name string }
	var waiting []waiter
	me := false
	counted := v1alpha1.Counted(op, check)
	for _, e := range counted {
		switch e.Phase {
		case v1alpha1.OperationFailed:
			failed = append(failed, e.Name)
		case v1alpha1.OperationSucceeded:
			// A canary counts once its soak is over (it holds its
			// slot until then): the others start after the soak.
			if left := r.SoakEnd(e).Sub(now); left > 0 {
				soaking = min(cmp.Or(soaking, left), left)
				continue
			}
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
	case stop != "":
		g.Stop = true
		g.Message = stop
		return g
	case r.BudgetSpent(len(failed)):
		g.Stop = true
		g.Message = fmt.Sprintf("halted: %d failed (%v), spec.rollout.failureBudget is %d", len(failed), failed, r.Budget())
		return g
	case r.Paused:
		g.Stop = true
		g.Message = "paused: spec.rollout.paused is true"
		return g
	}
	// Outside the windows a slot taken but not acted on goes back; work
	// started inside one finishes after it closes.
	closed, recheck, bad := windowGate(op, m, now)
	switch {
	case bad != nil:
		g.Stop = true
		g.Message = "refused: " + bad.Error()
		return g
	case closed != "":
		g.Stop = true
		g.Message = closed
		g.Recheck = recheck
		return g
	case (r.Percent() || ordered) && targets == 0:
		g.CountTargets = true
		g.Message = "counting the targets of the rollout"
		return g
	}
	slots, err := r.Slots(targets)
	if err != nil {
		g.Stop = true
		g.Message = "refused: " + err.Error()
		return g
	}
	canary := len(succeeded) < int(r.Canary)
	if canary {
		slots = 1
		g.Recheck = soaking
	}
	g.Slots = slots
	if !ordered {
		g.Try = true
		g.Message = fmt.Sprintf("waiting for one of %d rollout slots", slots)
		return g
	}
	// The line is known once every target has reported (or the window
	// is over): before, a target late to report could be passed over.
	if left := op.CreationTimestamp.Add(joinWindow).Sub(now); len(counted) < targets && left > 0 {
		g.Recheck = min(cmp.Or(g.Recheck, left), left)
		g.Message = fmt.Sprintf("waiting for all %d targets to report before the ordered rollout starts", targets)
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
		// The soak counts from this agent's own entry, timed by its own
		// worker: nothing another node wrote.
		if until := op.Spec.Rollout.SoakEnd(*e); in.Now.Before(until) {
			return Action{Type: SoakSlot, Operation: op, Until: until}, true, false
		}
		return Action{Type: ReleaseSlot, Operation: op}, true, false
	case dispatched:
		return Action{Type: KeepSlot, Operation: op, Request: unpublished(in, op, e)}, true, false
	case !wouldRequest:
		// Not targeted, paused Machine, invalid spec: nothing to wait
		// for; a slot taken for it goes back.
		return Action{Type: ReleaseSlot, Operation: op}, held, false
	}
	g := rolloutGate(op, m, in.NodeName, in.Now, in.Checks[op.Name], in.Targets[op.Name], in.Stop)
	if held && !g.Stop {
		return Action{}, false, true
	}
	return Action{Type: AwaitSlot, Operation: op, Gate: &g}, true, false
}

// unpublished is op's request on disk when the operation does not show it
// dispatched yet (no entry of this Machine, or still Waiting) and no worker
// has written a status for it: the Pending entry written with the request
// did not land (every waiting target writes the same object), and nothing
// else would write it before the worker's first status. Nil otherwise.
func unpublished(in Inputs, op *v1alpha1.MachineOperation, e *v1alpha1.MachineOperationTarget) *requests.Request {
	if e != nil && e.Phase != v1alpha1.OperationWaiting {
		return nil
	}
	for _, s := range in.Statuses {
		if opOf(s.RequestID) == op.Name {
			return nil
		}
	}
	for _, k := range requests.Kinds() {
		for _, r := range []*requests.Request{in.Pending[k], in.Claimed[k]} {
			if r != nil && r.Operation == op.Name {
				return r
			}
		}
	}
	return nil
}

// awaitSlot carries out AwaitSlot: the Waiting entry, then an attempt. The
// gate is computed again once the operation's targets are known: Decide's
// copy counted only the entries the last List vouched for.
func (l *loop) awaitSlot(ctx context.Context, a Action) error {
	op := a.Operation
	held, err := l.slots.Recover(ctx, slotOwner(op))
	if err != nil {
		return err
	}
	now := time.Now()
	complete, err := l.targets.refresh(ctx, l.listMachines, op, false, now)
	if err != nil {
		return err
	}
	m := l.machineOrEmpty()
	n, _ := l.targets.count(op)
	g := rolloutGate(op, m, l.NodeName, now, l.targets.check(op, m, l.NodeName), n, l.stopMessage())
	if err := l.reportWaiting(ctx, op, &g); err != nil {
		return err
	}
	if g.Recheck > 0 {
		l.nudgeIn(g.Recheck)
	}
	if held && g.Stop {
		return l.slots.Release(ctx, slotOwner(op))
	}
	if !g.Try || held {
		return nil
	}
	if !complete {
		// An entry no List has vouched for yet may be a target's
		// failure: no slot on a count that could be short. Decide
		// again when the next List may run.
		_, next := l.targets.unknown(op)
		l.nudgeIn(max(time.Until(next), time.Millisecond))
		return nil
	}
	ok, wait, err := l.slots.Try(ctx, slotOwner(op), g.Slots, l.targets.holders(op))
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
	if _, err := l.targets.refresh(ctx, l.listMachines, fresh, true, time.Now()); err != nil {
		return err
	}
	n, _ = l.targets.count(fresh)
	// The stop is read again from the server too: the watch may lag.
	stop, err := l.freshStop(ctx)
	if err != nil {
		return err
	}
	if g2 := rolloutGate(fresh, m, l.NodeName, time.Now(), l.targets.check(fresh, m, l.NodeName), n, stop); g2.Stop {
		l.Log.Info("gave the rollout slot back: the operation says wait", "operation", op.Name, "why", g2.Message)
		return l.slots.Release(ctx, slotOwner(op))
	}
	l.nudge()
	return nil
}

// soakSlot carries out SoakSlot: the slot stays held (found again after a
// restart, renewed by the keeper) until a.Until.
func (l *loop) soakSlot(ctx context.Context, a Action) error {
	if _, err := l.slots.Recover(ctx, slotOwner(a.Operation)); err != nil {
		return err
	}
	l.nudgeIn(max(time.Until(a.Until), time.Millisecond))
	return nil
}

// slotLost marks every request of operation op on disk (pending or claimed,
// a repave or a restart) as having lost its rollout slot: its worker stops
// before it disrupts the node, or, past its point of no return, records
// that it finished without the slot (requests.MarkSlotLost).
func (l *loop) slotLost(op, reason string) {
	for _, k := range []requests.Kind{requests.Repave, requests.Restart} {
		for _, read := range []func(requests.Kind) (*requests.Request, error){l.dir.Pending, l.dir.Claimed} {
			r, err := read(k)
			if err != nil || r == nil || r.Operation != op {
				continue
			}
			if err := l.dir.MarkSlotLost(r.ID, reason); err != nil {
				l.Log.Error("cannot tell the worker its rollout slot is lost", "request", r.ID, "err", err.Error())
				continue
			}
			l.Log.Warn("rollout slot lost: the worker stops before it disrupts the node", "request", r.ID, "operation", op, "why", reason)
		}
	}
}

// slotOwner names op's slots: by name and UID, so the leases of an earlier
// operation of the same name are not taken for this one's.
func slotOwner(op *v1alpha1.MachineOperation) rollout.Owner {
	return rollout.Owner{Name: op.Name, UID: op.UID}
}

// stopMessage is v1alpha1.StopMessage of the RolloutStops the watch holds,
// or, before it has listed them, a stop of its own: no slot is taken on a
// list not read.
func (l *loop) stopMessage() string {
	if l.stops == nil {
		return ""
	}
	if !l.stopsSynced() {
		return "stopped: the RolloutStops (the emergency stop) are not listed yet; `kubeslot cluster install` installs them"
	}
	var stops []v1alpha1.RolloutStop
	for _, obj := range l.stops.List() {
		stops = append(stops, *obj.(*v1alpha1.RolloutStop))
	}
	return v1alpha1.StopMessage(stops)
}

// freshStop is v1alpha1.StopMessage of the RolloutStops on the server.
func (l *loop) freshStop(ctx context.Context) (string, error) {
	var list v1alpha1.RolloutStopList
	if err := l.mc.REST().Get().Resource(v1alpha1.RolloutStopsResource).Do(ctx).Into(&list); err != nil {
		return "", fmt.Errorf("list RolloutStops: %w", err)
	}
	return v1alpha1.StopMessage(list.Items), nil
}

func (l *loop) machineOrEmpty() *v1alpha1.Machine {
	if obj, ok, _ := l.machine.GetByKey(l.MachineName); ok {
		return obj.(*v1alpha1.Machine)
	}
	return &v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: l.MachineName}}
}

// reportWaiting writes this Machine's Waiting entry when it differs from
// the one there (and status.targets, for people to read, while it is unset
// and this agent has Listed the targets; no agent reads it back).
//
// Every target of a rollout writes its entry into the one operation at
// about the same time, so the write is built on the informer's copy (no
// read first) and guarded by its resourceVersion; a write that conflicts
// is not retried at once but after a random pause from a window that
// doubles with each conflict (full jitter, capped): N writers then spread
// out and the join costs each a few requests whatever N is.
func (l *loop) reportWaiting(ctx context.Context, op *v1alpha1.MachineOperation, g *slotGate) error {
	e := v1alpha1.MachineOperationTarget{Name: l.MachineName, NodeName: l.NodeName, Phase: v1alpha1.OperationWaiting,
		Message: g.Message, OrderKey: g.OrderKey}
	same := func(cur *v1alpha1.MachineOperationTarget) bool {
		return cur != nil && cur.Phase == e.Phase && cur.Message == e.Message && cur.OrderKey == e.OrderKey
	}
	cur := op.Status.Target(e.Name, e.NodeName)
	// Only a selector operation's targets are ever Listed, so a count here is one.
	targets, listed := l.targets.count(op)
	setTargets := op.Status.Targets == 0 && listed && targets > 0
	if cur != nil && cur.Phase != v1alpha1.OperationWaiting {
		return nil // dispatched meanwhile (another pass)
	}
	if same(cur) && !setTargets {
		return nil
	}
	now := time.Now()
	w := l.waitWrites[op.UID]
	if w == nil {
		w = &waitWrite{}
		l.waitWrites[op.UID] = w
	}
	if now.Before(w.due) {
		l.nudgeIn(w.due.Sub(now))
		return nil
	}
	if same(&w.sent) && !setTargets && now.Sub(w.sentAt) < waitWriteEcho {
		return nil // written; the watch has not brought it back yet
	}
	next := op.DeepCopy()
	if setTargets {
		next.Status.Targets = int32(targets)
	}
	v1alpha1.SetMachineResult(next, e, l.targets.check(next, l.machineOrEmpty(), l.NodeName))
	err := l.patchOperationStatus(ctx, next)
	if err != nil {
		w.failures++
		window := min(l.waitBackoffCap(), l.waitBackoffBase()<<min(w.failures, 16))
		pause := time.Duration(rand.Int64N(int64(window)) + 1)
		w.due = now.Add(pause)
		l.nudgeIn(pause)
		if apierrors.IsConflict(err) {
			return nil // another target's write landed first: try again later
		}
		return fmt.Errorf("report Waiting on MachineOperation %s: %w", op.Name, err)
	}
	w.failures, w.due, w.sent, w.sentAt = 0, time.Time{}, e, now
	if setTargets {
		l.nudge() // the slots can be counted now
	}
	return nil
}

// waitWrite is the state of one operation's Waiting writes.
type waitWrite struct {
	failures int
	due      time.Time
	sent     v1alpha1.MachineOperationTarget
	sentAt   time.Time
}

// waitWriteEcho bounds how long a written Waiting entry is taken as
// written while the informer's copy does not show it yet.
const waitWriteEcho = 30 * time.Second

// The Waiting writes' backoff window: the first pause after a conflict is
// up to a tenth of the rollout poll, doubling to four polls.
func (l *loop) waitBackoffBase() time.Duration { return max(l.rolloutPoll/10, time.Millisecond) }
func (l *loop) waitBackoffCap() time.Duration  { return 4 * max(l.rolloutPoll, time.Millisecond) }

// patchOperationStatus writes op's status as it is, only over the
// resourceVersion op was read at (409 Conflict otherwise).
func (l *loop) patchOperationStatus(ctx context.Context, op *v1alpha1.MachineOperation) error {
	patch, err := json.Marshal([]map[string]any{
		{"op": "replace", "path": "/metadata/resourceVersion", "value": op.ResourceVersion},
		{"op": "add", "path": "/status", "value": op.Status},
	})
	if err != nil {
		return err
	}
	return l.mc.REST().Patch(types.JSONPatchType).Resource(v1alpha1.MachineOperationsResource).Name(op.Name).
		SubResource("status").Body(patch).Do(ctx).Error()
}

// forgetGone drops what the loop keeps of operations that are gone.
func (l *loop) forgetGone(ops []v1alpha1.MachineOperation) {
	l.targets.keep(ops)
	live := map[types.UID]bool{}
	for i := range ops {
		live[ops[i].UID] = true
	}
	for uid := range l.waitWrites {
		if !live[uid] {
			delete(l.waitWrites, uid)
		}
	}
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
