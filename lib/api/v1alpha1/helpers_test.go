package v1alpha1

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestTargets(t *testing.T) {
	m := &Machine{ObjectMeta: metav1.ObjectMeta{Name: "m1", Labels: map[string]string{"pool": "gpu", "zone": "a", LabelEnrolled: "true"}}}
	sel := func(s MachineSelector) *MachineOperation {
		return &MachineOperation{Spec: MachineOperationSpec{MachineSelector: &s}}
	}
	cases := []struct {
		name string
		op   *MachineOperation
		want bool
	}{
		{"ref to it", &MachineOperation{Spec: MachineOperationSpec{MachineRef: &MachineReference{Name: "m1"}}}, true},
		{"ref to another", &MachineOperation{Spec: MachineOperationSpec{MachineRef: &MachineReference{Name: "m2"}}}, false},
		{"no target", &MachineOperation{}, false},
		{"matching labels", sel(MachineSelector{MatchLabels: map[string]string{"pool": "gpu"}}), true},
		{"other labels", sel(MachineSelector{MatchLabels: map[string]string{"pool": "cpu"}}), false},
		{"empty selector selects nothing", sel(MachineSelector{}), false},
		{"In", sel(MachineSelector{MatchExpressions: []SelectorRequirement{{Key: "zone", Operator: SelectorIn, Values: []string{"a", "b"}}}}), true},
		{"NotIn", sel(MachineSelector{MatchExpressions: []SelectorRequirement{{Key: "zone", Operator: SelectorNotIn, Values: []string{"a"}}}}), false},
		{"NotIn absent key", sel(MachineSelector{MatchExpressions: []SelectorRequirement{{Key: "rack", Operator: SelectorNotIn, Values: []string{"a"}}}}), true},
		{"Exists", sel(MachineSelector{MatchExpressions: []SelectorRequirement{{Key: "pool", Operator: SelectorExists}}}), true},
		{"DoesNotExist", sel(MachineSelector{MatchExpressions: []SelectorRequirement{{Key: "pool", Operator: SelectorDoesNotExist}}}), false},
		{"labels and expressions", sel(MachineSelector{MatchLabels: map[string]string{"pool": "gpu"},
			MatchExpressions: []SelectorRequirement{{Key: "zone", Operator: SelectorIn, Values: []string{"b"}}}}), false},
	}
	for _, tc := range cases {
		got, err := tc.op.Targets(m)
		if err != nil || got != tc.want {
			t.Errorf("%s: Targets = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
	// A Machine an administrator has not enrolled (as every Machine a node made for itself) is nobody's target,
	// not even of a selector that would match a Machine without labels.
	made := &Machine{ObjectMeta: metav1.ObjectMeta{Name: "m1", Labels: map[string]string{"pool": "gpu"}}}
	for _, tc := range cases {
		if tc.op.Spec.MachineSelector == nil {
			continue
		}
		if got, err := tc.op.Targets(made); err != nil || got {
			t.Errorf("%s, Machine not enrolled: Targets = %v, %v; want false", tc.name, got, err)
		}
		if got, err := tc.op.Targets(&Machine{}); err != nil || got {
			t.Errorf("%s, Machine without labels: Targets = %v, %v; want false", tc.name, got, err)
		}
	}
	wrong := &Machine{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"pool": "gpu", "zone": "a", LabelEnrolled: "yes"}}}
	if got, _ := cases[3].op.Targets(wrong); got {
		t.Errorf("%s=yes counts as enrolled; only \"true\" does", LabelEnrolled)
	}
	bad := sel(MachineSelector{MatchExpressions: []SelectorRequirement{{Key: "zone", Operator: "Near", Values: []string{"a"}}}})
	if got, err := bad.Targets(m); err == nil || got {
		t.Errorf("a selector with an unknown operator: %v, %v; want no target and an error", got, err)
	}
}

func TestSetMachineResult(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Minute))
	op := &MachineOperation{ObjectMeta: metav1.ObjectMeta{Name: "op"}}

	SetMachineResult(op, MachineOperationTarget{Name: "b", NodeName: "nb", Phase: OperationPending, ObservedMachineGeneration: 3}, CountAll)
	if op.Status.Phase != OperationPending || op.Status.StartTime != nil || op.Status.ObservedMachineGeneration != 3 {
		t.Errorf("one pending entry: %+v", op.Status)
	}
	SetMachineResult(op, MachineOperationTarget{Name: "b", NodeName: "nb", Phase: OperationInProgress, Message: "draining", StartTime: &t1}, CountAll)
	if len(op.Status.Machines) != 1 || op.Status.Phase != OperationInProgress || op.Status.Message != "draining" || !op.Status.StartTime.Equal(&t1) {
		t.Errorf("replacing the entry: %+v", op.Status)
	}
	SetMachineResult(op, MachineOperationTarget{Name: "a", NodeName: "na", Phase: OperationSucceeded, StartTime: &t0, CompletionTime: &t1, Message: "done"}, CountAll)
	if got := op.Status.Machines; len(got) != 2 || got[0].Name != "a" || got[1].Name != "b" {
		t.Errorf("entries not kept in name order: %+v", got)
	}
	if op.Status.Phase != OperationInProgress || !op.Status.StartTime.Equal(&t0) || op.Status.CompletionTime != nil ||
		!strings.Contains(op.Status.Message, "2 machines: 1 succeeded, 0 failed, 1 in progress") {
		t.Errorf("one done, one running: %+v", op.Status)
	}
	// the same machine name under another node is a separate entry
	SetMachineResult(op, MachineOperationTarget{Name: "a", NodeName: "other", Phase: OperationFailed, Message: "boom", CompletionTime: &t1}, CountAll)
	if len(op.Status.Machines) != 3 || op.Status.Phase != OperationFailed || !op.Status.CompletionTime.Equal(&t1) {
		t.Errorf("a failed entry: %+v", op.Status)
	}
	if e := op.Status.Target("a", "na"); e == nil || e.Phase != OperationSucceeded {
		t.Errorf("Target(a, na) = %+v", e)
	}

	single := &MachineOperation{}
	SetMachineResult(single, MachineOperationTarget{Name: "a", NodeName: "na", Phase: OperationSucceeded, Message: "restarted", CompletionTime: &t1}, nil)
	if single.Status.Phase != OperationSucceeded || single.Status.Message != "restarted" || !single.Status.CompletionTime.Equal(&t1) {
		t.Errorf("single target succeeded: %+v", single.Status)
	}
	long := &MachineOperation{}
	for _, n := range []string{"a", "b"} {
		SetMachineResult(long, MachineOperationTarget{Name: n, NodeName: n, Phase: OperationPending, Message: strings.Repeat("é", 3000)}, CountAll)
	}
	if len(long.Status.Message) > 4096 || !utf8Valid(long.Status.Message) {
		t.Errorf("summary message of %d bytes (valid UTF-8: %v), want at most 4096", len(long.Status.Message), utf8Valid(long.Status.Message))
	}
}

// An entry any node could have written counts only when its Machine exists
// with that node name and the operation targets it.
func TestSummaryCountsOnlyVerifiedEntries(t *testing.T) {
	op := &MachineOperation{Spec: MachineOperationSpec{MachineSelector: &MachineSelector{MatchLabels: map[string]string{"pool": "p"}},
		Rollout: &Rollout{}}}
	mk := func(name, node string, labels map[string]string) Machine {
		m := Machine{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
		m.Labels[LabelEnrolled] = "true"
		m.Spec.NodeName = node
		return m
	}
	targets := TargetNodesOf(op, []Machine{
		mk("a", "na", map[string]string{"pool": "p"}),
		mk("b", "nb", map[string]string{"pool": "p"}),
		mk("other", "no", map[string]string{"pool": "q"}), // not targeted
	})
	if len(targets) != 2 || targets["a"] != "na" || targets["b"] != "nb" {
		t.Fatalf("TargetNodesOf = %v, want a and b", targets)
	}
	op.Status.Machines = []MachineOperationTarget{
		{Name: "no-such-machine", NodeName: "evil", Phase: OperationFailed}, // no Machine
		{Name: "b", NodeName: "evil", Phase: OperationFailed},               // another node's Machine
		{Name: "other", NodeName: "no", Phase: OperationFailed},             // not targeted
		{Name: "b", NodeName: "nb", Phase: OperationWaiting},
	}
	SetMachineResult(op, MachineOperationTarget{Name: "a", NodeName: "na", Phase: OperationInProgress}, targets.Check)
	s := op.Status
	if s.Phase != OperationInProgress || s.Failed != 0 || s.InProgress != 1 || s.Waiting != 1 || len(s.Machines) != 5 {
		t.Errorf("status %s failed=%d inProgress=%d waiting=%d entries=%d, want InProgress 0/1/1 with the forged entries kept",
			s.Phase, s.Failed, s.InProgress, s.Waiting, len(s.Machines))
	}
	if !strings.Contains(s.Message, "3 entries not counted") {
		t.Errorf("message %q does not say 3 entries are not counted", s.Message)
	}
	if got := Counted(op, nil); len(got) != 0 {
		t.Errorf("a nil check counted %d entries, want none", len(got))
	}
	// With a nil check the writer's own entry still counts.
	SetMachineResult(op, MachineOperationTarget{Name: "a", NodeName: "na", Phase: OperationSucceeded}, nil)
	if op.Status.Done != 1 || op.Status.Phase != OperationSucceeded {
		t.Errorf("own entry alone: done=%d phase %s, want 1 Succeeded", op.Status.Done, op.Status.Phase)
	}
}

func TestAgentUsername(t *testing.T) {
	if got := AgentUsername("n1.example.com"); got != "system:node:n1.example.com" {
		t.Errorf("AgentUsername = %q", got)
	}
}
func utf8Valid(s string) bool { return utf8.ValidString(s) }

func TestStopMessage(t *testing.T) {
	if got := StopMessage(nil); got != "" {
		t.Errorf("no stop: %q, want none", got)
	}
	mk := func(name, reason string) RolloutStop {
		s := RolloutStop{Spec: RolloutStopSpec{Reason: reason}}
		s.Name = name
		return s
	}
	got := StopMessage([]RolloutStop{mk("zeta", ""), mk("alpha", "incident 7")})
	want := "stopped: RolloutStop alpha exists (incident 7) and 1 more; delete every RolloutStop to resume"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := StopMessage([]RolloutStop{mk("all", "")}); got != "stopped: RolloutStop all exists; delete every RolloutStop to resume" {
		t.Errorf("one stop without a reason: %q", got)
	}
}

func TestSoakEnd(t *testing.T) {
	done := metav1.NewTime(time.Date(2026, 3, 29, 1, 59, 0, 0, time.UTC))
	ok := MachineOperationTarget{Phase: OperationSucceeded, CompletionTime: &done}
	r := &Rollout{SoakSeconds: 90}
	if got, want := r.SoakEnd(ok), done.Add(90*time.Second); !got.Equal(want) {
		t.Errorf("soak of a success: %v, want %v", got, want)
	}
	failed := ok
	failed.Phase = OperationFailed
	untimed := ok
	untimed.CompletionTime = nil
	for what, c := range map[string]struct {
		r *Rollout
		e MachineOperationTarget
	}{"failed": {r, failed}, "no completion time": {r, untimed}, "no soak": {&Rollout{}, ok}, "no rollout": {nil, ok}} {
		if got := c.r.SoakEnd(c.e); !got.IsZero() {
			t.Errorf("%s: soak until %v, want none", what, got)
		}
	}
}
