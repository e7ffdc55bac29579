package watcher

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	nodedrain "github.com/kubeslot/kubeslot/lib/drain"
	"github.com/kubeslot/kubeslot/lib/machineclient"
	"github.com/kubeslot/kubeslot/lib/release"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/state"
)

// EventNamespace holds the Events about Machines: they are cluster-scoped,
// and Events of cluster-scoped objects go to "default", as the kubelet's
// Events about its Node do.
const EventNamespace = "default"

func mkdir(p string) error { return os.MkdirAll(p, 0o700) }

// inputs gathers what Decide looks at, from the informers' caches and disk.
func (l *loop) inputs() (Inputs, error) {
	in := Inputs{NodeName: l.NodeName, MachineName: l.MachineName, AgentVersion: l.AgentVersion, Published: l.published,
		NodeSynced: true, Pending: map[requests.Kind]*requests.Request{}, Claimed: map[requests.Kind]*requests.Request{},
		HooksErr:      l.HooksErr,
		ProbationOver: time.Since(l.Started) >= l.UpgradeProbation}
	if l.Root != nil {
		in.DeviceStat = l.Root.StatFollow
	}
	if obj, ok, _ := l.machine.GetByKey(l.MachineName); ok {
		in.Machine = obj.(*v1alpha1.Machine).DeepCopy()
	}
	var node any
	node, in.NodeExists, _ = l.node.GetByKey(l.NodeName)
	if n, ok := node.(*coreNode); ok {
		in.NodeKubeletVersion = n.Status.NodeInfo.KubeletVersion
		if n.Spec.Unschedulable {
			in.NodeCordonedBy = n.Annotations[nodedrain.Annotation]
		}
	}
	for _, obj := range l.ops.List() {
		in.Operations = append(in.Operations, *obj.(*v1alpha1.MachineOperation).DeepCopy())
	}
	in.Stop = l.stopMessage()
	in.Now = time.Now()
	in.Checks = map[string]func(v1alpha1.MachineOperationTarget) bool{}
	in.Targets = map[string]int{}
	if l.targets != nil {
		l.forgetGone(in.Operations)
		for i := range in.Operations {
			op := &in.Operations[i]
			in.Checks[op.Name] = l.targets.check(op, in.Machine, l.NodeName)
			if n, ok := l.targets.count(op); ok {
				in.Targets[op.Name] = n
			}
		}
	}
	in.Slots = map[string]bool{}
	for i := range in.Operations {
		if op := &in.Operations[i]; l.slots != nil && l.slots.Held(slotOwner(op)) {
			in.Slots[op.Name] = true
		}
	}
	in.Applied, in.AppliedErr = l.store.ActiveApplied()
	l.checkNodeAddr(&in, node)
	for _, k := range requests.Kinds() {
		p, err := l.dir.Pending(k)
		if errors.Is(err, requests.ErrInvalid) {
			// Its worker moves it aside with a Failed status; it must not
			// stop the watcher from deciding anything else.
			l.Log.Warn("ignoring an unusable request file", "err", err.Error())
			p, err = nil, nil
		}
		if err != nil {
			return in, err
		}
		c, err := l.dir.Claimed(k)
		if errors.Is(err, requests.ErrInvalid) {
			l.Log.Warn("ignoring an unusable claimed request", "err", err.Error())
			c, err = nil, nil
		}
		if err != nil {
			return in, err
		}
		in.Pending[k], in.Claimed[k] = p, c
	}
	st, bad, err := l.dir.ListStatus()
	if err != nil {
		return in, err
	}
	for _, e := range bad {
		l.Log.Warn("ignoring a damaged status file", "err", e.Error())
	}
	in.Statuses = st
	// The gauges that live in status files, back at once after a restart.
	l.Metrics.Statuses(st)
	// A damaged signal is the upgrader's to rewrite; it must not stop the
	// watcher from deciding anything else.
	if in.Upgrade, err = l.dir.ReadUpgradeSignal(); err != nil {
		l.Log.Warn("ignoring a damaged pending-upgrade signal", "err", err.Error())
		in.Upgrade = nil
	}
	if in.Probation, err = l.dir.ReadProbation(); err != nil {
		// Damaged: the release is treated as past its probation (last-good
		// stays where it is); the file is left for a person to read.
		l.Log.Warn("ignoring a damaged upgrade probation file", "err", err.Error())
		in.Probation = nil
	}
	// Unknown ("") when a link is missing: nothing is then read into it.
	in.Current, _ = release.Current(l.Root)
	in.LastGood, _ = release.LastGood(l.Root)
	return in, nil
}

// once decides and acts; failures are logged and retried on the next nudge
// or after a short pause.
func (l *loop) once(ctx context.Context) {
	in, err := l.inputs()
	if err != nil {
		l.Log.Error("cannot read the host root", "err", err.Error())
		return
	}
	if probationWaits(in) && l.probationTimer == nil {
		wait := time.Until(l.Started.Add(l.UpgradeProbation)) + 50*time.Millisecond
		l.Log.Info("this release is on probation after its upgrade; last-good moves to it once the watcher has been up for the window",
			"request", in.Probation.RequestID, "version", l.AgentVersion, "in", wait.Round(time.Millisecond))
		l.probationTimer = time.AfterFunc(wait, l.nudge)
	}
	failed := false
	for _, a := range Decide(in) {
		err := l.do(ctx, in, a)
		if err == nil {
			delete(l.reported, a.String())
			continue
		}
		failed = true
		if ctx.Err() != nil {
			// Stopping (SIGTERM, re-exec, new identity): the next loop
			// decides again from what is on disk.
			break
		}
		if l.reported == nil {
			l.reported = map[string]string{}
		}
		if l.reported[a.String()] != err.Error() {
			l.reported[a.String()] = err.Error()
			l.Log.Warn("action failed; will retry with backoff", "action", a.String(), "err", err.Error())
		} else {
			l.Log.Debug("action failed again", "action", a.String(), "err", err.Error())
		}
	}
	l.expire(ctx, in)
	if !failed && in.Probation != nil && rollbackAwaitsStatus(in, in.Probation.RequestID) {
		l.nudge() // the status went out in this pass: the rollback after it comes next
	}
	if failed {
		l.failures++
		time.AfterFunc(retryDelay(l.failures, rand.Float64()), l.nudge)
		return
	}
	l.failures = 0
	if time.Since(l.lastPrune) > time.Hour {
		l.lastPrune = time.Now()
		removed, err := l.dir.Prune(l.published, time.Now().Add(-statusRetention))
		if err != nil {
			l.Log.Warn("cannot prune old status files", "err", err.Error())
		} else if len(removed) > 0 {
			l.Log.Info("pruned old status files", "requests", removed)
		}
	}
}

func (l *loop) do(ctx context.Context, in Inputs, a Action) error {
	ctx, cancel := context.WithTimeout(ctx, l.CallTimeout)
	defer cancel()
	switch a.Type {
	case WriteRequest:
		wrote, err := l.dir.Write(a.Request)
		if err != nil || !wrote {
			return err
		}
		l.Log.Info("request written", "id", a.Request.ID, "reason", a.Request.Reason)
		if a.Request.Operation != "" {
			// The operation shows Pending at once; the worker's status moves it on.
			return l.publishPending(ctx, in, a.Request)
		}
		return nil
	case PublishStatus:
		return l.publish(ctx, in, a.Status)
	case ReportMachine:
		return l.report(ctx, in, a)
	case FinishUpgrade:
		return l.finishUpgrade(a)
	case EndProbation:
		return l.endProbation(in, a)
	case ReportRollback:
		return l.reportRollback(ctx, in, a)
	case AwaitSlot:
		return l.awaitSlot(ctx, a)
	case KeepSlot:
		held, err := l.slots.Recover(ctx, slotOwner(a.Operation))
		if err != nil {
			return err
		}
		if !held {
			// Its request runs, or is about to, and the slot it was
			// written under is gone (taken over, or deleted, while this
			// watcher was away): its worker must not disrupt the node.
			l.slotLost(a.Operation.Name, "no rollout slot of operation "+a.Operation.Name+" is held by this node any more")
		}
		if a.Request != nil {
			// Its Pending entry did not land with the request (rollout.go).
			return l.publishPending(ctx, in, a.Request)
		}
		return nil
	case ReleaseSlot:
		return l.slots.Release(ctx, slotOwner(a.Operation))
	case SoakSlot:
		return l.soakSlot(ctx, a)
	case Uncordon:
		return l.uncordon(ctx, in, a)
	case HealthGate:
		return l.healthGate(ctx, in, a)
	case RegisterMachine:
		_, err := l.mc.CreateMachine(ctx, a.Machine)
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		if apierrors.IsForbidden(err) {
			return v1alpha1.NotEnrolled(a.Machine.Name, err)
		}
		if err == nil {
			l.Log.Info("registered the Machine", "machine", a.Machine.Name, "node", a.Machine.Spec.NodeName)
		}
		return err
	}
	return fmt.Errorf("unknown action %s", a.Type)
}

// finishUpgrade puts a release reported Succeeded on probation, writes the
// upgrade's final status, then removes the pending-upgrade signal: killed
// in between, the next watcher finds the final status and only removes the
// signal. The probation goes first, so that no Succeeded is ever on disk
// without it.
func (l *loop) finishUpgrade(a Action) error {
	if a.Probation != nil {
		p := *a.Probation
		p.SucceededAt = time.Now().UTC()
		if err := l.dir.WriteProbation(&p); err != nil {
			return fmt.Errorf("put release %s on probation: %w", p.ToRelease, err)
		}
	}
	if a.Status != nil {
		if err := l.dir.WriteStatus(a.Status); err != nil {
			return err
		}
		l.Log.Info("agent upgrade finished", "request", a.Status.RequestID, "phase", a.Status.Phase, "message", a.Status.Message)
	}
	if err := l.dir.RemoveUpgradeSignal(); err != nil {
		return fmt.Errorf("remove the pending-upgrade signal: %w", err)
	}
	return nil
}

// publish reports one status transition and then marks it published.
func (l *loop) publish(ctx context.Context, in Inputs, s *requests.Status) error {
	if s.Operation != "" {
		if err := l.publishOperation(ctx, in, s); err != nil {
			return err
		}
	} else if (s.Kind == requests.Repave || s.Kind == requests.Restart) && s.Phase.Finished() && in.Machine != nil {
		// The spec's own change: a repave, or a patch in place.
		if err := l.setCondition(ctx, repavedCondition(s)); err != nil {
			return err
		}
	}
	if s.Kind == requests.Upgrade && s.Phase.Finished() && in.Machine != nil {
		if err := l.setCondition(ctx, upgradedCondition(s)); err != nil {
			return err
		}
	}
	if in.Machine != nil {
		l.event(ctx, in.Machine, s)
	}
	l.published[s.RequestID] = s.Phase
	if err := l.dir.SavePublished(l.published); err != nil {
		return err
	}
	l.Metrics.Published(s)
	return nil
}

func repavedCondition(s *requests.Status) metav1.Condition {
	ok, failed := v1alpha1.ReasonRepaved, v1alpha1.ReasonRepaveFailed
	if s.Kind == requests.Restart {
		ok, failed = v1alpha1.ReasonPatchedInPlace, v1alpha1.ReasonPatchFailed
	}
	if s.Phase == requests.Succeeded {
		return cond(v1alpha1.ConditionRepaved, true, ok, s.Message, s.MachineGeneration)
	}
	return cond(v1alpha1.ConditionRepaved, false, failed, s.Message, s.MachineGeneration)
}

func upgradedCondition(s *requests.Status) metav1.Condition {
	if s.Phase == requests.Succeeded {
		return cond(v1alpha1.ConditionAgentUpgraded, true, v1alpha1.ReasonUpgraded, s.Message, s.MachineGeneration)
	}
	return cond(v1alpha1.ConditionAgentUpgraded, false, v1alpha1.ReasonUpgradeFailed, s.Message, s.MachineGeneration)
}

// publishPending shows request r of an operation as Pending in its status.
func (l *loop) publishPending(ctx context.Context, in Inputs, r *requests.Request) error {
	return l.publishOperation(ctx, in, &requests.Status{RequestID: r.ID, Kind: r.Kind,
		Operation: r.Operation, MachineGeneration: r.MachineGeneration, Phase: requests.Pending,
		Message: "dispatched to the " + string(r.Kind) + " worker", UpdatedAt: time.Now().UTC()})
}

func (l *loop) publishOperation(ctx context.Context, in Inputs, s *requests.Status) error {
	start := metav1.NewTime(s.UpdatedAt)
	if len(s.Phases) > 0 {
		start = metav1.NewTime(s.Phases[0].StartedAt)
	}
	e := v1alpha1.MachineOperationTarget{Name: l.MachineName, NodeName: l.NodeName, Phase: v1alpha1.OperationPhase(s.Phase),
		Message: s.Message, StartTime: &start, ObservedMachineGeneration: s.MachineGeneration}
	if s.Phase.Finished() {
		end := metav1.NewTime(s.UpdatedAt)
		e.CompletionTime = &end
	}
	e.Steps = entrySteps(s.Phases)
	_, err := l.mc.UpdateOperationStatus(ctx, s.Operation, func(op *v1alpha1.MachineOperation) error {
		if cur := op.Status.Target(e.Name, e.NodeName); cur != nil && cur.Phase == e.Phase && cur.Message == e.Message {
			return errNoChange
		}
		// The summary counts only the entries of real targets
		// (targets.go); an unforced List at most once per poll.
		if _, err := l.targets.refresh(ctx, l.listMachines, op, false, time.Now()); err != nil {
			return err
		}
		v1alpha1.SetMachineResult(op, e, l.targets.check(op, in.Machine, l.NodeName))
		return nil
	})
	if apierrors.IsNotFound(errors.Unwrap(err)) || apierrors.IsNotFound(err) {
		l.Log.Info("operation gone; result not published", "operation", s.Operation, "phase", s.Phase)
		return nil
	}
	return err
}

// entrySteps are a worker's step timings as an operation entry shows them:
// the last 16 (the schema's bound; a rollback adds steps to a repave).
func entrySteps(ps []requests.PhaseTiming) []v1alpha1.OperationStep {
	ps = ps[max(0, len(ps)-16):]
	var out []v1alpha1.OperationStep
	for _, p := range ps {
		if p.Name == "" || len(p.Name) > 63 {
			continue
		}
		out = append(out, v1alpha1.OperationStep{Name: p.Name, StartTime: metav1.NewMicroTime(p.StartedAt),
			DurationMilliseconds: max(0, p.Duration.Milliseconds())})
	}
	return out
}

// event records a transition on the Machine. Best effort: an Event that
// cannot be written is logged, never retried into a duplicate.
func (l *loop) event(ctx context.Context, m *v1alpha1.Machine, s *requests.Status) {
	typ, reason := eventTypeNormal, "Request"+string(s.Phase)
	if s.Phase == requests.Failed {
		typ = eventTypeWarning
	}
	what := string(s.Kind)
	if s.Kind == requests.Restart && s.Operation == "" {
		what = "in-place patch" // the spec's own change, applied in place
	}
	if s.Operation != "" {
		what += " (MachineOperation " + s.Operation + ")"
	}
	l.postEvent(ctx, m, typ, reason, fmt.Sprintf("%s %s: %s", what, s.Phase, s.Message))
}

// postEvent records an Event of type typ on the Machine m; best effort.
func (l *loop) postEvent(ctx context.Context, m *v1alpha1.Machine, typ, reason, msg string) {
	now := metav1.NewTime(time.Now())
	ev := &coreEvent{
		ObjectMeta: metav1.ObjectMeta{GenerateName: m.Name + ".", Namespace: EventNamespace},
		InvolvedObject: coreObjectReference{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "Machine",
			Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion},
		Reason: reason, Type: typ, Message: msg,
		Source:         coreEventSource{Component: "kubeslot-watcher", Host: l.NodeName},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if err := l.core.Post().Namespace(EventNamespace).Resource("events").Body(ev).Do(ctx).Error(); err != nil {
		l.Log.Warn("cannot record an Event on the Machine", "machine", m.Name, "err", err.Error())
	}
}

var errNoChange = machineclient.ErrNoChange

func (l *loop) setCondition(ctx context.Context, c metav1.Condition) error {
	_, err := l.mc.UpdateMachineStatus(ctx, l.MachineName, func(m *v1alpha1.Machine) error {
		before := m.Status.DeepCopy()
		meta.SetStatusCondition(&m.Status.Conditions, c)
		if equality.Semantic.DeepEqual(before, &m.Status) {
			return errNoChange
		}
		return nil
	})
	return err
}

// report writes the Machine's status when it differs from what is there.
func (l *loop) report(ctx context.Context, in Inputs, a Action) (err error) {
	if in.Machine == nil {
		return nil
	}
	mutate := func(m *v1alpha1.Machine) error {
		before := m.Status.DeepCopy()
		st := &m.Status
		st.Phase = a.Phase
		st.AgentVersion = l.AgentVersion
		if in.Applied != nil {
			st.ObservedGeneration = m.Generation
			st.ActiveSlot = in.Applied.Slot
			st.Applied = appliedSummary(in.Applied, in.NodeKubeletVersion)
		}
		for _, c := range a.Conditions {
			meta.SetStatusCondition(&st.Conditions, c)
		}
		if equality.Semantic.DeepEqual(before, st) {
			return errNoChange
		}
		return nil
	}
	// A changed Draining condition is also an Event (pods left, the
	// blocking budget), once: compared with what the Machine holds.
	for _, c := range a.Conditions {
		if c.Type != v1alpha1.ConditionDraining {
			continue
		}
		if typ, reason, msg, ok := drainEvent(meta.FindStatusCondition(in.Machine.Status.Conditions, c.Type), c); ok {
			defer func() {
				if err == nil {
					l.postEvent(ctx, in.Machine, typ, reason, msg)
				}
			}()
		}
	}
	// The informer's copy is current enough to tell that nothing changed,
	// which keeps an idle watcher from calling the API at all.
	if errors.Is(mutate(in.Machine.DeepCopy()), errNoChange) {
		return nil
	}
	_, err = l.mc.UpdateMachineStatus(ctx, l.MachineName, mutate)
	return err
}

// appliedSummary is the Machine's status.applied for the active slot. Its
// Kubernetes version is what the Node reports its kubelet runs (the
// version read, not the one asked for); before the Node reports one,
// the applied configuration's, which the repaver checked against the
// binary and the Node before it committed.
func appliedSummary(a *state.Applied, nodeKubelet string) *v1alpha1.AppliedConfig {
	version := a.Config.Kubernetes.Version
	if v := strings.TrimPrefix(nodeKubelet, "v"); v != "" {
		version = v
	}
	out := &v1alpha1.AppliedConfig{
		KubernetesVersion: version,
		RootFSSHA256:      v1alpha1.SHA256(a.Config.RootFS.SHA256),
		Summary:           a.Config.Summary(),
		Fingerprint:       v1alpha1.SHA256(a.Config.Fingerprint()),
	}
	if !a.AppliedAt.IsZero() {
		// As the API keeps it (whole seconds): compared with the
		// informer's copy, a time with nanoseconds always differs, and
		// every decision (each Node status update, every 5 minutes at
		// least) would cost a GET and a no-op PATCH of the Machine.
		at := metav1.NewTime(a.AppliedAt).Rfc3339Copy()
		out.AppliedAt = &at
	}
	return out
}

// Retry of failed actions: 2 s after the first failure, doubling up to 5
// minutes, each delay jittered by ±20 % so that a fleet refused by the same
// apiserver does not retry in step, and a permanent error costs one
// request every few minutes, not every 2 s. Any event nudges the loop earlier.
const (
	retryFirst = 2 * time.Second
	retryMax   = 5 * time.Minute
)

// retryDelay is the pause after the n-th failed pass in a row; r in [0,1)
// picks the jitter.
func retryDelay(n int, r float64) time.Duration {
	d := retryFirst
	for i := 1; i < n && d < retryMax; i++ {
		d *= 2
	}
	d = min(d, retryMax)
	return time.Duration(float64(d) * (0.8 + 0.4*r))
}
