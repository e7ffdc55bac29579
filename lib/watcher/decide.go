package watcher

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/state"
)

// Inputs is everything Decide looks at.
type Inputs struct {
	// NodeName is this host's node (the agent identity's).
	NodeName string
	// MachineName is the name the Machine has, or would be registered with.
	MachineName string
	// Machine is nil when it does not exist.
	Machine *v1alpha1.Machine
	// NodeSynced says the Node watch has listed; NodeExists is then
	// whether the Node object exists.
	NodeSynced, NodeExists bool
	// NodeKubeletVersion is the kubelet version the Node reports
	// (status.nodeInfo.kubeletVersion), "" when unknown.
	NodeKubeletVersion string
	// NodeCordonedBy is the request that cordoned the Node, when it is
	// unschedulable with kubeslot's annotation (lib/drain); "" otherwise.
	NodeCordonedBy string
	// Applied is the active slot's applied configuration (checksum
	// verified); AppliedErr is why it could not be read.
	Applied    *state.Applied
	AppliedErr error
	// Operations are MachineOperations that may target the Machine; Decide
	// checks each itself.
	Operations []v1alpha1.MachineOperation
	// Pending and Claimed are the request files on disk, by kind.
	Pending, Claimed map[requests.Kind]*requests.Request
	// Statuses are the status files on disk.
	Statuses []*requests.Status
	// Published is the published marker.
	Published requests.Published
	// AgentVersion is this binary's version.
	AgentVersion string
	// Upgrade is the pending-upgrade signal (requests.UpgradeSignal), nil
	// when there is none.
	Upgrade *requests.UpgradeSignal
	// Probation is the release on probation after its upgrade's verdict
	// (requests.Probation), nil when there is none. ProbationOver says
	// this watcher process has been up for its probation window
	// (Options.UpgradeProbation). Current and LastGood are the release
	// names <base>/current and <base>/last-good point at ("" unknown).
	Probation         *requests.Probation
	ProbationOver     bool
	Current, LastGood string
	// HooksErr is why the active slot's lifecycle hooks could not be
	// ensured at start ("" when they were).
	HooksErr string
	// NodeAddrErr is what the post-start check found wrong with the Node's
	// address (nodeaddr.go); "" when nothing.
	NodeAddrErr string
	// Checks say, by operation name, which entries of its status.machines
	// count (targets.go); an operation without one counts none.
	Checks map[string]func(v1alpha1.MachineOperationTarget) bool
	// Targets are, by operation name, how many enrolled Machines a
	// selector operation targets, as this agent last Listed them (absent:
	// not Listed yet). A rollout's slots and its line are computed from
	// it, never from status.targets, which any participating node writes.
	Targets map[string]int
	// Slots are the rollout operations this agent holds a slot of.
	Slots map[string]bool
	// Stop says why every rollout is stopped (v1alpha1.StopMessage of the
	// RolloutStops, which only admins write); "" when none is.
	Stop string
	// Now is when the inputs were read (an ordered rollout's join window).
	Now time.Time
	// DeviceStat looks at the host's device nodes a spec names (nil:
	// judged by name alone).
	DeviceStat config.DeviceStat
}

// ActionType says what an Action does.
type ActionType string

// Action types.
const (
	// WriteRequest drops Action.Request into requests/.
	WriteRequest ActionType = "WriteRequest"
	// PublishStatus publishes Action.Status to the cluster (operation entry,
	// Machine condition, Event) and then marks it published.
	PublishStatus ActionType = "PublishStatus"
	// ReportMachine writes the Machine's status: Action.Phase and
	// Action.Conditions.
	ReportMachine ActionType = "ReportMachine"
	// RegisterMachine creates Action.Machine.
	RegisterMachine ActionType = "RegisterMachine"
	// FinishUpgrade turns the pending-upgrade signal into the upgrade's
	// final status: it writes Action.Probation (a Succeeded verdict puts
	// the release on probation), then Action.Status (unless it is nil: a
	// final status is already there), then removes the signal. The status
	// is published by a later decision, as any worker's.
	FinishUpgrade ActionType = "FinishUpgrade"
	// EndProbation ends Action.Probation: last-good moves to its release
	// (when Action.Advance), then the file goes.
	EndProbation ActionType = "EndProbation"
	// ReportRollback publishes Action.Probation's rollback after Succeeded
	// (operation entry, Machine condition, Event), then removes the file.
	ReportRollback ActionType = "ReportRollback"
)

// Action is one thing to do.
type Action struct {
	Type       ActionType
	Request    *requests.Request
	Status     *requests.Status
	Machine    *v1alpha1.Machine
	Phase      v1alpha1.MachinePhase
	Conditions []metav1.Condition
	Probation  *requests.Probation
	Advance    bool
	// Operation, Gate and Until: the slot actions (rollout.go).
	Operation *v1alpha1.MachineOperation
	Gate      *slotGate
	Until     time.Time
}

func (a Action) String() string {
	switch a.Type {
	case WriteRequest:
		return "WriteRequest " + a.Request.ID
	case PublishStatus:
		return fmt.Sprintf("PublishStatus %s %s", a.Status.RequestID, a.Status.Phase)
	case ReportMachine:
		var cs []string
		for _, c := range a.Conditions {
			cs = append(cs, fmt.Sprintf("%s=%s/%s", c.Type, c.Status, c.Reason))
		}
		return fmt.Sprintf("ReportMachine %s %s", a.Phase, strings.Join(cs, ","))
	case RegisterMachine:
		return "RegisterMachine " + a.Machine.Name
	case FinishUpgrade:
		if a.Status == nil {
			return "FinishUpgrade (remove the signal)"
		}
		return fmt.Sprintf("FinishUpgrade %s %s", a.Status.RequestID, a.Status.Phase)
	case EndProbation:
		return fmt.Sprintf("EndProbation %s %s advance=%v", a.Probation.RequestID, a.Probation.ToRelease, a.Advance)
	case ReportRollback:
		return fmt.Sprintf("ReportRollback %s %s", a.Probation.RequestID, a.Probation.ToVersion)
	case AwaitSlot:
		return fmt.Sprintf("AwaitSlot %s try=%v %s", a.Operation.Name, a.Gate.Try, a.Gate.Message)
	case KeepSlot, ReleaseSlot:
		return string(a.Type) + " " + a.Operation.Name
	case HealthGate:
		return fmt.Sprintf("HealthGate %s %s", a.Operation.Name, a.Status.RequestID)
	case Uncordon:
		return "Uncordon (cordoned by " + a.Status.RequestID + ")"
	case SoakSlot:
		return fmt.Sprintf("SoakSlot %s until %s", a.Operation.Name, a.Until.UTC().Format(time.RFC3339))
	}
	return string(a.Type)
}

// Reasons the watcher reports beyond the API's own.
const (
	ReasonAppliedCorrupt = "AppliedConfigCorrupt"
	ReasonWrongNode      = "WrongNode"
	ReasonDispatched     = "Dispatched"
	// ReasonDispatchedInPlace: the change goes in place (UpdateMethod).
	ReasonDispatchedInPlace = "DispatchedInPlace"
	ReasonHooksFailed       = "LifecycleHooksFailed"
)

// kindOf maps an operation type to the request kind that carries it out.
func kindOf(t v1alpha1.OperationType) (requests.Kind, bool) {
	switch t {
	case v1alpha1.OperationNodeRestart:
		return requests.Restart, true
	case v1alpha1.OperationRepave, v1alpha1.OperationUpdate: // Update: updateKind decides per target
		return requests.Repave, true
	case v1alpha1.OperationAgentUpgrade:
		return requests.Upgrade, true
	case v1alpha1.OperationAgentReset:
		return requests.Reset, true
	}
	return "", false
}

// opOf returns the operation part of a request ID.
func opOf(id string) string {
	parts := strings.SplitN(id, "-", 3)
	if len(parts) < 3 {
		return ""
	}
	return parts[2]
}

// Decide returns what to do, in order. It never returns a WriteRequest for
// an ID that is pending, claimed or has a status (kill -9 safe: that is all
// on disk), nor for an operation already dispatched under another
// generation.
func Decide(in Inputs) []Action {
	// Results are published whatever else holds: reporting is not acting.
	// Publishing calls the API, so it comes after any request written below:
	// a worker should not wait for the cluster.
	publish := publications(in)
	if a, refused := refusal(in); refused {
		return append(publish, a)
	}
	m := in.Machine
	d := onDisk(in)
	desired, specErr := Desired(in.Applied.Config, &m.Spec.Node, in.DeviceStat)
	var slotActs []Action
	for i := range in.Operations {
		op := &in.Operations[i]
		r := operationRequest(op, m, in.NodeName, in.Applied.Config, desired, specErr)
		if paced(op) {
			// A rollout's request waits for a slot (rollout.go).
			a, ok, write := slotAction(in, op, m, d.knownOps[op.Name], r != nil)
			if ok {
				slotActs = append(slotActs, a)
			}
			if !write {
				continue
			}
		}
		if d.knownOps[op.Name] {
			continue // dispatched already, maybe under another generation
		}
		if r != nil {
			d.write(r)
		}
	}
	repave, r := repaveCondition(in, m, desired, specErr)
	if r != nil {
		d.write(r)
	}
	conds := []metav1.Condition{repave}
	hooksBad := specErr == nil && (in.HooksErr != "" || in.NodeAddrErr != "")
	if c, ok := healthCondition(in, m, specErr); ok {
		conds = append(conds, c)
	}
	if c, ok := drainingCondition(in, m.Generation); ok {
		conds = append(conds, c)
	}
	var out []Action
	for _, r := range d.reqs {
		out = append(out, Action{Type: WriteRequest, Request: r})
	}
	out = append(out, publish...)
	if a, ok := leftCordoned(in, d); ok {
		out = append(out, a)
	}
	out = append(out, slotActs...)
	return append(out, Action{Type: ReportMachine, Phase: machinePhase(specErr, d.busy, hooksBad), Conditions: conds})
}

// publications are the results to record or publish whatever else holds: an
// upgrade's outcome first (only the watcher that runs after a switch can tell
// it), then the end of a probation or a rollback after it, then every status
// not yet published in its phase.
func publications(in Inputs) []Action {
	var publish []Action
	if a, ok := finishUpgrade(in); ok {
		publish = append(publish, a)
	}
	if a, ok := probation(in); ok {
		publish = append(publish, a)
	}
	for _, s := range in.Statuses {
		if in.Published[s.RequestID] == s.Phase {
			continue
		}
		// A rollout's health gate holds a success back (health.go).
		if op := gated(s, in.Operations); op != nil {
			publish = append(publish, Action{Type: HealthGate, Status: s, Operation: op})
			continue
		}
		publish = append(publish, Action{Type: PublishStatus, Status: s})
	}
	return publish
}

// refusal is the one action when the watcher must not dispatch anything: no
// trustworthy applied configuration, no Machine yet (register it), or a
// Machine that names another node.
func refusal(in Inputs) (Action, bool) {
	if in.AppliedErr != nil || in.Applied == nil {
		msg := "no applied configuration: the host has no committed slot"
		if in.AppliedErr != nil {
			msg = "refusing to act: " + in.AppliedErr.Error()
		}
		return degraded(ReasonAppliedCorrupt, msg), true
	}
	if in.Machine == nil {
		return Action{Type: RegisterMachine, Machine: NewMachine(in.MachineName, in.NodeName, in.Applied)}, true
	}
	if m := in.Machine; m.Spec.NodeName != in.NodeName {
		return degraded(ReasonWrongNode,
			fmt.Sprintf("Machine %s has spec.nodeName %q, this host is node %q: nothing dispatched", m.Name, m.Spec.NodeName, in.NodeName)), true
	}
	return Action{}, false
}

// dispatch is what the request files and statuses on disk say was asked
// already, and the requests Decide adds to it: the kill -9 safety of Decide.
type dispatch struct {
	known    map[string]bool // request IDs pending, claimed, with a status or written now
	knownOps map[string]bool // operations with such a request (the spec's own excluded)
	// A kind with a claimed request, or a pending one an operation asked for,
	// gets no other request until it is done. A pending spec-driven request
	// is replaced by a newer one of its kind: nothing ran it yet. A spec
	// request waits while the spec's request of the other kind (a repave,
	// or a patch in place) is pending or claimed, so the two never race.
	busy, replaceable, spec map[requests.Kind]bool
	reqs                    []*requests.Request // to write, in order
}

// onDisk reads the dispatch state from the request files and statuses.
func onDisk(in Inputs) *dispatch {
	d := &dispatch{known: map[string]bool{}, knownOps: map[string]bool{},
		busy: map[requests.Kind]bool{}, replaceable: map[requests.Kind]bool{}, spec: map[requests.Kind]bool{}}
	for _, k := range slices.Sorted(maps.Keys(in.Pending)) {
		if r := in.Pending[k]; r != nil {
			d.note(r.ID)
			d.busy[k] = true
			d.replaceable[k] = opOf(r.ID) == requests.SpecOperation
			d.spec[k] = d.spec[k] || d.replaceable[k]
		}
	}
	for k, r := range in.Claimed {
		if r != nil {
			d.note(r.ID)
			d.busy[k] = true
			d.replaceable[k] = false
			d.spec[k] = d.spec[k] || opOf(r.ID) == requests.SpecOperation
		}
	}
	for _, s := range in.Statuses {
		d.note(s.RequestID)
	}
	return d
}

// note records a request ID seen on disk, and its operation.
func (d *dispatch) note(id string) {
	d.known[id] = true
	if op := opOf(id); op != requests.SpecOperation {
		d.knownOps[op] = true
	}
}

// write adds r unless its ID is known or its kind is busy with a request it
// may not replace: one request per kind at a time.
func (d *dispatch) write(r *requests.Request) {
	spec := opOf(r.ID) == requests.SpecOperation
	if d.known[r.ID] || (d.busy[r.Kind] && !(spec && d.replaceable[r.Kind])) {
		return
	}
	if spec {
		for k, on := range d.spec {
			if on && k != r.Kind {
				return
			}
		}
		d.spec[r.Kind] = true
	}
	d.replaceable[r.Kind] = false
	d.busy[r.Kind] = true
	d.known[r.ID] = true
	d.reqs = append(d.reqs, r)
}

// operationRequest is the request op asks of Machine m on node, nil when it
// asks nothing now: another machine's, finished here, of no known type,
// paused (all but a reset), or not dispatchable while the spec is invalid or
// its parameters are incomplete.
func operationRequest(op *v1alpha1.MachineOperation, m *v1alpha1.Machine, node string, applied, desired *config.Config, specErr error) *requests.Request {
	if ok, _ := op.Targets(m); !ok {
		return nil // another machine's
	}
	if e := op.Status.Target(m.Name, node); e != nil && e.Phase.Finished() {
		return nil
	}
	kind, ok := kindOf(op.Spec.Type)
	if !ok {
		return nil
	}
	if m.Spec.Paused && kind != requests.Reset {
		return nil
	}
	if specErr != nil && kind != requests.Reset {
		return nil // reported by repaveCondition; nothing dispatched
	}
	if op.Spec.Type == v1alpha1.OperationUpdate {
		kind = updateKind(m, applied, desired)
	}
	r := &requests.Request{
		Kind: kind, ID: requests.NewID(kind, m.Generation, op.Name), MachineGeneration: m.Generation,
		Operation: op.Name, Reason: fmt.Sprintf("MachineOperation %s (%s)", op.Name, op.Spec.Type),
	}
	switch kind {
	case requests.Repave:
		r.Desired, r.Disruption = desired, disruptionOf(m)
	case requests.Restart:
		r.Disruption = disruptionOf(m)
		if op.Spec.Type == v1alpha1.OperationUpdate {
			r.Desired = desired // the in-place path (lib/repave, Patch)
		}
	case requests.Upgrade:
		p := op.Spec.Parameters
		if p == nil || p.BundleURL == "" || p.BundleSHA256 == "" {
			return nil // the schema requires them; never dispatch half a request
		}
		r.Upgrade = &requests.UpgradeParams{URL: string(p.BundleURL), SHA256: string(p.BundleSHA256)}
	}
	return r
}

// healthCondition is the Degraded condition beside a valid spec: failed
// lifecycle hooks, or healthy. With an invalid spec repaveCondition already
// reports Degraded, so there is none.
func healthCondition(in Inputs, m *v1alpha1.Machine, specErr error) (metav1.Condition, bool) {
	switch {
	case specErr != nil:
		return metav1.Condition{}, false
	case in.HooksErr != "":
		return cond(v1alpha1.ConditionDegraded, true, ReasonHooksFailed,
			"the lifecycle hooks of slot "+in.Applied.Slot+" could not be ensured at watcher start (the node keeps running; restart kubeslot-watcher to retry): "+in.HooksErr, m.Generation), true
	case in.NodeAddrErr != "":
		return cond(v1alpha1.ConditionDegraded, true, ReasonNodeAddress, in.NodeAddrErr, m.Generation), true
	}
	return cond(v1alpha1.ConditionDegraded, false, v1alpha1.ReasonHealthy, "", m.Generation), true
}

// machinePhase is the Machine's phase: an invalid spec first, then the
// busiest stage (reset over upgrade over repave), then failed hooks.
func machinePhase(specErr error, busy map[requests.Kind]bool, hooksBad bool) v1alpha1.MachinePhase {
	switch {
	case specErr != nil:
		return v1alpha1.MachineDegraded
	case busy[requests.Reset]:
		return v1alpha1.MachineResetting
	case busy[requests.Upgrade]:
		return v1alpha1.MachineUpgrading
	case busy[requests.Repave]:
		return v1alpha1.MachineRepaving
	case hooksBad:
		return v1alpha1.MachineDegraded
	}
	return v1alpha1.MachineReady
}

// finishUpgrade decides what the pending-upgrade signal asks of this
// watcher (see requests.UpgradeSignal): a recorded failure is final at once;
// success only from the new release (AgentVersion is ToVersion), once the
// upgrader verified it (its health gate: this watcher stayed up, unrestarted,
// for the health window) and this process synced; the release then goes on
// probation. Anything else waits. A final status already on disk (a crash
// between writing it and removing the signal) is kept: only the signal goes.
func finishUpgrade(in Inputs) (Action, bool) {
	sig := in.Upgrade
	if sig == nil {
		return Action{}, false
	}
	for _, s := range in.Statuses {
		if s.RequestID == sig.RequestID && s.Phase.Finished() {
			return Action{Type: FinishUpgrade}, true
		}
	}
	st := &requests.Status{RequestID: sig.RequestID, Kind: requests.Upgrade, Operation: sig.Operation,
		MachineGeneration: sig.MachineGeneration, Phases: sig.Phases}
	switch {
	case sig.Failure != "":
		st.Phase, st.Message = requests.Failed, sig.Failure
	case sig.Verified && sig.ToVersion != "" && sig.ToRelease != "" && in.AgentVersion == sig.ToVersion:
		st.Phase = requests.Succeeded
		st.Message = fmt.Sprintf("agent upgraded from %s to %s", sig.FromVersion, sig.ToVersion)
		return Action{Type: FinishUpgrade, Status: st, Probation: &requests.Probation{RequestID: sig.RequestID,
			Operation: sig.Operation, MachineGeneration: sig.MachineGeneration, FromRelease: sig.FromRelease,
			FromVersion: sig.FromVersion, ToRelease: sig.ToRelease, ToVersion: sig.ToVersion}}, true
	default:
		return Action{}, false
	}
	return Action{Type: FinishUpgrade, Status: st}, true
}

func short(fp string) string {
	if len(fp) > 12 {
		return fp[:12]
	}
	return fp
}

func cond(typ string, status bool, reason, msg string, gen int64) metav1.Condition {
	s := metav1.ConditionFalse
	if status {
		s = metav1.ConditionTrue
	}
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	return metav1.Condition{Type: typ, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen}
}

func degraded(reason, msg string) Action {
	return Action{Type: ReportMachine, Phase: v1alpha1.MachineDegraded,
		Conditions: []metav1.Condition{cond(v1alpha1.ConditionDegraded, true, reason, msg, 0)}}
}

// NewMachine is the Machine a host registers when it has none: named name,
// for node, with the applied configuration as its spec (so nothing differs)
// and the OnNodeDelete policy. It carries the enrolled label: only a node
// an administrator enrolled may create it (v1alpha1.LabelEnrolled).
func NewMachine(name, node string, a *state.Applied) *v1alpha1.Machine {
	c := a.Config
	n := v1alpha1.NodeConfig{
		KubernetesVersion: c.Kubernetes.Version,
		RootFS:            v1alpha1.RootFS{Source: v1alpha1.URL(c.RootFS.Source), SHA256: v1alpha1.SHA256(c.RootFS.SHA256)},
		Artifacts:         &v1alpha1.Artifacts{},
	}
	if k := c.Artifacts.Kubelet; k.URL != "" {
		// A kubelet from the release mirror is left out: the version
		// alone then picks it.
		n.Artifacts.Kubelet = &v1alpha1.Artifact{URL: v1alpha1.URL(k.URL), SHA256: v1alpha1.SHA256(k.SHA256)}
	}
	for _, o := range []struct {
		src *config.Artifact
		dst **v1alpha1.Artifact
	}{{c.Artifacts.Containerd, &n.Artifacts.Containerd}, {c.Artifacts.Runc, &n.Artifacts.Runc}, {c.Artifacts.CNIPlugins, &n.Artifacts.CNIPlugins}} {
		if o.src != nil {
			*o.dst = &v1alpha1.Artifact{URL: v1alpha1.URL(o.src.URL), SHA256: v1alpha1.SHA256(o.src.SHA256)}
		}
	}
	for k, v := range c.Kubernetes.Labels {
		if n.Labels == nil {
			n.Labels = map[string]v1alpha1.LabelValue{}
		}
		n.Labels[k] = v1alpha1.LabelValue(v)
	}
	for _, t := range c.Kubernetes.Taints {
		n.Taints = append(n.Taints, v1alpha1.Taint(t))
	}
	m := &v1alpha1.Machine{Spec: v1alpha1.MachineSpec{NodeName: node, Node: n, UpdatePolicy: v1alpha1.UpdateOnNodeDelete}}
	m.Name = name
	m.Labels = v1alpha1.EnrolledLabels()
	return m
}
