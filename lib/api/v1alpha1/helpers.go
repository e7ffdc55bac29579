package v1alpha1

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// The agent identity is the node's own: the kubelet client certificate the
// host keeps in its root. The access-control manifests rely on exactly this
// form, so it lives here and not in each caller.
const (
	// NodeUserPrefix starts the user name of a node identity.
	NodeUserPrefix = "system:node:"
	// NodesGroup is the group every node identity belongs to.
	NodesGroup = "system:nodes"
)

// AgentUsername is the user name the agent of the node nodeName
// authenticates as.
func AgentUsername(nodeName string) string { return NodeUserPrefix + nodeName }

// AsLabelSelector converts s to the apimachinery form.
func (s *MachineSelector) AsLabelSelector() *metav1.LabelSelector {
	if s == nil {
		return nil
	}
	out := &metav1.LabelSelector{}
	if len(s.MatchLabels) > 0 {
		out.MatchLabels = make(map[string]string, len(s.MatchLabels))
		for k, v := range s.MatchLabels {
			out.MatchLabels[k] = v
		}
	}
	for _, r := range s.MatchExpressions {
		out.MatchExpressions = append(out.MatchExpressions, metav1.LabelSelectorRequirement{
			Key: r.Key, Operator: metav1.LabelSelectorOperator(r.Operator), Values: slices.Clone(r.Values),
		})
	}
	return out
}

// LabelEnrolled, with the value "true", marks a Machine a member of the
// fleet: only such Machines are targets of a selector operation, and only
// they take part in a rollout's counts. Membership is a cluster admin's
// decision (`kubeslot cluster enroll`): a ClusterRoleBinding of the node to
// kubeslot:fleet-member, the only grant that lets a node write anything of
// kubeslot's. The node's agent then creates its Machine with this label and
// no other (admission refuses any other label, and every later change of a
// Machine's metadata by a node); a node no admin enrolled can create
// nothing, so the label on a node-made Machine always follows an
// administrator's binding.
const LabelEnrolled = "kubeslot.dev/enrolled"

// NotEnrolled explains a refused registration of Machine name: the usual
// cause is a node no administrator enrolled yet.
func NotEnrolled(name string, err error) error {
	return fmt.Errorf("register Machine %s: %w (a node takes part in kubeslot only once a cluster admin enrolls it: kubeslot cluster enroll %s)", name, err, name)
}

// EnrolledLabels are the labels of a Machine an enrolled node registers
// for itself: the mark alone.
func EnrolledLabels() map[string]string { return map[string]string{LabelEnrolled: "true"} }

// Selector returns the Machines s selects as a labels.Selector: those whose
// labels match s and that carry LabelEnrolled=true. An empty or nil
// selector selects nothing here (the schema refuses it anyway): an
// operation must never reach every Machine by accident.
func (s *MachineSelector) Selector() (labels.Selector, error) {
	if s == nil || (len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 0) {
		return labels.Nothing(), nil
	}
	sel, err := metav1.LabelSelectorAsSelector(s.AsLabelSelector())
	if err != nil {
		return nil, fmt.Errorf("machineSelector: %w", err)
	}
	enrolled, err := labels.NewRequirement(LabelEnrolled, selection.Equals, []string{"true"})
	if err != nil {
		return nil, err
	}
	return sel.Add(*enrolled), nil
}

// Targets reports whether op is meant for m: its machineRef names m, or its
// machineSelector matches m's labels. A selector that does not parse
// targets nothing, and the error says why.
func (op *MachineOperation) Targets(m *Machine) (bool, error) {
	switch {
	case op.Spec.MachineRef != nil:
		return op.Spec.MachineRef.Name == m.Name, nil
	case op.Spec.MachineSelector != nil:
		sel, err := op.Spec.MachineSelector.Selector()
		if err != nil {
			return false, fmt.Errorf("MachineOperation %s: %w", op.Name, err)
		}
		return sel.Matches(labels.Set(m.Labels)), nil
	}
	return false, nil
}

// Target returns the entry of status.machines for the Machine name on node
// nodeName, or nil.
func (s *MachineOperationStatus) Target(name, nodeName string) *MachineOperationTarget {
	for i := range s.Machines {
		if s.Machines[i].Name == name && s.Machines[i].NodeName == nodeName {
			return &s.Machines[i]
		}
	}
	return nil
}

// An entry check says whether an entry of status.machines is to be
// counted (a func(MachineOperationTarget) bool: controller-gen takes no
// named func type in an API package). Admission checks only that an agent writes entries under its own node
// name (DESIGN.md, "Admission cost"): an entry naming a Machine that does
// not exist, belongs to another node or is not a target of the operation
// can be in the list, and every reader counts only the entries its check
// passes.
// +kubebuilder:object:generate=false

// TargetNodes maps the name of each Machine an operation targets to its
// spec.nodeName, as read from the cluster.
type TargetNodes map[string]string

// TargetNodesOf is the TargetNodes of op among ms: the Machines op targets
// (a selector that does not parse targets none).
func TargetNodesOf(op *MachineOperation, ms []Machine) TargetNodes {
	out := TargetNodes{}
	for i := range ms {
		if ok, err := op.Targets(&ms[i]); ok && err == nil {
			out[ms[i].Name] = ms[i].Spec.NodeName
		}
	}
	return out
}

// Check counts an entry only when its Machine is one of t with that node
// name. A nil t counts nothing.
func (t TargetNodes) Check(e MachineOperationTarget) bool {
	n, ok := t[e.Name]
	return ok && n == e.NodeName
}

// CountAll counts every entry: for a reader that has verified them
// otherwise, or trusts every writer (tests, cluster admins' tools).
func CountAll(MachineOperationTarget) bool { return true }

// Counted returns the entries of op's status that check passes; a nil
// check passes none, so a reader that forgot to verify counts nothing.
func Counted(op *MachineOperation, check func(MachineOperationTarget) bool) []MachineOperationTarget {
	if check == nil {
		return nil
	}
	var out []MachineOperationTarget
	for _, e := range op.Status.Machines {
		if check(e) {
			out = append(out, e)
		}
	}
	return out
}

// SetMachineResult records one Machine's progress in op's status (the entry
// with e's name and node name is replaced or added) and recomputes the
// summary fields from the entries check passes and e, which the writer
// vouches for (its own); a nil check counts e alone. It is what an agent calls before it writes the
// status: the access-control policy lets it change only its own entries
// and the summary.
func SetMachineResult(op *MachineOperation, e MachineOperationTarget, check func(MachineOperationTarget) bool) {
	e.Message = truncate(e.Message, 4096) // the schema's limit
	if cur := op.Status.Target(e.Name, e.NodeName); cur != nil {
		*cur = e
	} else {
		op.Status.Machines = append(op.Status.Machines, e)
		slices.SortFunc(op.Status.Machines, func(a, b MachineOperationTarget) int {
			if c := strings.Compare(a.Name, b.Name); c != 0 {
				return c
			}
			return strings.Compare(a.NodeName, b.NodeName)
		})
	}
	counted := Counted(op, func(x MachineOperationTarget) bool {
		return (x.Name == e.Name && x.NodeName == e.NodeName) || (check != nil && check(x))
	})
	summarize(op, counted, e)
}

// Verified returns op's status as the entries check passes make it: the
// summary recomputed from them alone, whatever summary a node wrote.
// Readers that act on an operation's phase (the expiry of a finished
// operation) read this, never the stored summary.
func Verified(op *MachineOperation, check func(MachineOperationTarget) bool) MachineOperationStatus {
	v := op.DeepCopy()
	summarize(v, Counted(v, check), MachineOperationTarget{})
	return v.Status
}

// summarize derives the summary (phase, counts, times, message,
// conditions) from the counted entries; last is the
// entry just written, whose message and generation the summary shows.
func summarize(op *MachineOperation, counted []MachineOperationTarget, last MachineOperationTarget) {
	s := &op.Status
	counts := map[OperationPhase]int{}
	var start, end *metav1.Time
	for i := range counted {
		m := &counted[i]
		counts[m.Phase]++
		if m.StartTime != nil && (start == nil || m.StartTime.Before(start)) {
			start = m.StartTime.DeepCopy()
		}
		if m.CompletionTime != nil && (end == nil || end.Before(m.CompletionTime)) {
			end = m.CompletionTime.DeepCopy()
		}
	}
	n := len(counted)
	s.Done, s.Failed = int32(counts[OperationSucceeded]), int32(counts[OperationFailed])
	s.InProgress = int32(counts[OperationPending] + counts[OperationInProgress])
	s.Waiting = int32(counts[OperationWaiting])
	finished := counts[OperationSucceeded] + counts[OperationFailed]
	r := op.Spec.Rollout
	switch {
	case r != nil && r.BudgetSpent(counts[OperationFailed]) && finished < n:
		s.Phase = OperationHalted
	case counts[OperationFailed] > 0 && (r == nil || finished == n):
		s.Phase = OperationFailed
	case n > 0 && counts[OperationSucceeded] == n:
		s.Phase = OperationSucceeded
	case counts[OperationInProgress] > 0 || finished > 0:
		s.Phase = OperationInProgress
	default:
		s.Phase = OperationPending
	}
	s.StartTime = start
	if s.Phase.Finished() {
		s.CompletionTime = end
	} else {
		s.CompletionTime = nil
	}
	switch {
	case n == 1:
		s.Message = truncate(last.Message, 4096)
	case s.Phase == OperationHalted:
		s.Message = fmt.Sprintf("%d machines: halted, %d failed (spec.rollout.failureBudget %d: raise it to resume, or delete the operation): %s; %d succeeded, %d in progress, %d waiting",
			n, counts[OperationFailed], r.Budget(), strings.Join(failedNames(counted), ", "),
			counts[OperationSucceeded], s.InProgress, s.Waiting)
	default:
		s.Message = fmt.Sprintf("%d machines: %d succeeded, %d failed, %d in progress, %d pending, %d waiting; last %s: %s",
			n, counts[OperationSucceeded], counts[OperationFailed], counts[OperationInProgress], counts[OperationPending],
			counts[OperationWaiting], last.Name, last.Message)
	}
	if ignored := len(s.Machines) - n; ignored > 0 {
		// Said first, so the truncation below never hides it.
		s.Message = fmt.Sprintf("(%d entries not counted: no Machine of that name and node that the operation targets) %s", ignored, s.Message)
	}
	s.Message = truncate(s.Message, 4096)
	if last.ObservedMachineGeneration != 0 || last.Phase != OperationWaiting {
		s.ObservedMachineGeneration = last.ObservedMachineGeneration
	}
	setConditions(op, counted)
}

// failedNames names the Machines whose entries failed.
func failedNames(es []MachineOperationTarget) []string {
	var out []string
	for _, e := range es {
		if e.Phase == OperationFailed {
			out = append(out, e.Name)
		}
	}
	return out
}

// truncate shortens s to at most n bytes without splitting a character.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
