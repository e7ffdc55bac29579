package v1alpha1

import (
	"strings"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestOperationConditions: the three conditions follow the phase the same
// entries give, a node's junk conditions are dropped, and a condition
// keeps its transition time while its status holds.
func TestOperationConditions(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	at := func(s int) *metav1.Time { x := metav1.NewTime(t0.Add(time.Duration(s) * time.Second)); return &x }
	one := int32(1)
	op := &MachineOperation{ObjectMeta: metav1.ObjectMeta{Name: "op", Generation: 3, CreationTimestamp: t0},
		Spec: MachineOperationSpec{Rollout: &Rollout{FailureBudget: &one}}}
	op.Status.Conditions = []metav1.Condition{{Type: "Junk", Status: metav1.ConditionTrue, Reason: "Forged"}}
	set := func(name string, phase OperationPhase, start, end *metav1.Time) {
		SetMachineResult(op, MachineOperationTarget{Name: name, NodeName: name, Phase: phase, StartTime: start, CompletionTime: end}, CountAll)
	}
	want := func(step string, typ string, status metav1.ConditionStatus, reason string) {
		t.Helper()
		c := apimeta.FindStatusCondition(op.Status.Conditions, typ)
		if c == nil || c.Status != status || c.Reason != reason || c.ObservedGeneration != 3 || c.LastTransitionTime.IsZero() {
			t.Errorf("%s: %s = %+v, want %s %s", step, typ, c, status, reason)
		}
	}
	set("a", OperationWaiting, nil, nil)
	set("b", OperationWaiting, nil, nil)
	set("c", OperationWaiting, nil, nil)
	if len(op.Status.Conditions) != 3 {
		t.Fatalf("conditions %+v: want exactly Progressing, Complete, Halted", op.Status.Conditions)
	}
	want("waiting", OpConditionProgressing, metav1.ConditionTrue, "Pending")
	want("waiting", OpConditionComplete, metav1.ConditionFalse, "Pending")
	want("waiting", OpConditionHalted, metav1.ConditionFalse, ReasonWithinFailureBudget)
	if c := apimeta.FindStatusCondition(op.Status.Conditions, OpConditionProgressing); !c.LastTransitionTime.Equal(&t0) {
		t.Errorf("no entry has a time: transition %v, want the creation %v", c.LastTransitionTime, t0)
	}

	set("a", OperationInProgress, at(10), nil)
	want("a in progress", OpConditionProgressing, metav1.ConditionTrue, "InProgress")
	if c := apimeta.FindStatusCondition(op.Status.Conditions, OpConditionProgressing); !c.LastTransitionTime.Equal(&t0) {
		t.Errorf("Progressing stayed True: transition %v, want it kept (%v)", c.LastTransitionTime, t0)
	}
	set("a", OperationFailed, at(10), at(20))
	want("a failed", OpConditionHalted, metav1.ConditionTrue, ReasonFailureBudgetSpent)
	want("a failed", OpConditionProgressing, metav1.ConditionFalse, "Halted")
	want("a failed", OpConditionComplete, metav1.ConditionFalse, "Halted")
	c := apimeta.FindStatusCondition(op.Status.Conditions, OpConditionHalted)
	if !c.LastTransitionTime.Equal(at(20)) || !strings.Contains(c.Message, "(a)") || !strings.Contains(c.Message, "2 waiting") {
		t.Errorf("Halted: %+v, want it at a's completion, naming a and 2 waiting", c)
	}

	// A raised budget resumes it; then everything else succeeds.
	op.Spec.Rollout.FailureBudget = ptr(int32(2))
	set("b", OperationSucceeded, at(30), at(40))
	set("c", OperationSucceeded, at(50), at(60))
	want("finished", OpConditionComplete, metav1.ConditionFalse, "Failed")
	want("finished", OpConditionProgressing, metav1.ConditionFalse, "Failed")
	want("finished", OpConditionHalted, metav1.ConditionFalse, ReasonWithinFailureBudget)

	// Every target succeeds: Complete.
	ok := &MachineOperation{ObjectMeta: metav1.ObjectMeta{Generation: 3}}
	SetMachineResult(ok, MachineOperationTarget{Name: "a", NodeName: "a", Phase: OperationSucceeded, StartTime: at(1), CompletionTime: at(2)}, nil)
	op = ok
	want("single", OpConditionComplete, metav1.ConditionTrue, "Succeeded")
	want("single", OpConditionHalted, metav1.ConditionFalse, ReasonNoRollout)
	want("single", OpConditionProgressing, metav1.ConditionFalse, "Succeeded")

	// Paused with nothing under way: not progressing.
	op = &MachineOperation{ObjectMeta: metav1.ObjectMeta{Generation: 3}, Spec: MachineOperationSpec{Rollout: &Rollout{Paused: true}}}
	set("a", OperationWaiting, nil, nil)
	want("paused", OpConditionProgressing, metav1.ConditionFalse, ReasonRolloutPaused)
	want("paused", OpConditionComplete, metav1.ConditionFalse, "Pending")
}

func ptr[T any](v T) *T { return &v }
