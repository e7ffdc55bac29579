package v1alpha1

import (
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition types of a MachineOperation: a summary for people and for
// `kubectl wait`, derived with the phase from the same counted entries.
const (
	// OpConditionProgressing is True while targets act or may still start;
	// False once the operation finished, halted, or is paused with nothing
	// under way.
	OpConditionProgressing = "Progressing"
	// OpConditionComplete is True once every target succeeded (phase
	// Succeeded). A finished operation with failures is Complete False,
	// reason Failed, and Progressing False.
	OpConditionComplete = "Complete"
	// OpConditionHalted is True while a rollout's failure budget is spent
	// and targets still wait (phase Halted).
	OpConditionHalted = "Halted"
)

// Reasons of the operation conditions besides the phases' own names
// (Pending, InProgress, Succeeded, Failed, Halted).
const (
	ReasonFailureBudgetSpent  = "FailureBudgetSpent"
	ReasonWithinFailureBudget = "WithinFailureBudget"
	ReasonNoRollout           = "NoRollout" // not paced: nothing halts it
	ReasonRolloutPaused       = "Paused"    // spec.rollout.paused with no target under way
)

// setConditions derives the operation's conditions from the summary just
// computed from counted. The list holds exactly these three types, so a
// node cannot crowd the honest writers out of the list's bound; a
// condition keeps its lastTransitionTime while its status holds.
func setConditions(op *MachineOperation, counted []MachineOperationTarget) {
	s := &op.Status
	r := op.Spec.Rollout
	counts := fmt.Sprintf("%d of %d machines succeeded, %d failed, %d in progress, %d waiting",
		s.Done, len(counted), s.Failed, s.InProgress, s.Waiting)

	progressing := metav1.Condition{Type: OpConditionProgressing, Status: metav1.ConditionTrue, Reason: string(s.Phase), Message: counts}
	switch {
	case s.Phase.Finished() || s.Phase == OperationHalted:
		progressing.Status = metav1.ConditionFalse
	case r != nil && r.Paused && s.InProgress == 0:
		progressing.Status, progressing.Reason = metav1.ConditionFalse, ReasonRolloutPaused
		progressing.Message = "spec.rollout.paused: no target starts (" + counts + ")"
	}

	complete := metav1.Condition{Type: OpConditionComplete, Status: metav1.ConditionFalse, Reason: string(s.Phase), Message: counts}
	if s.Phase == OperationSucceeded {
		complete.Status = metav1.ConditionTrue
	}

	halted := metav1.Condition{Type: OpConditionHalted, Status: metav1.ConditionFalse, Reason: ReasonWithinFailureBudget,
		Message: fmt.Sprintf("%d failed, spec.rollout.failureBudget %d", s.Failed, r.Budget())}
	switch {
	case r == nil:
		halted.Reason, halted.Message = ReasonNoRollout, "no spec.rollout: the operation does not halt on failures"
	case s.Phase == OperationHalted:
		halted.Status, halted.Reason = metav1.ConditionTrue, ReasonFailureBudgetSpent
		halted.Message = fmt.Sprintf("%d failed (%s), spec.rollout.failureBudget %d: %d waiting targets do not start; raise the budget to resume, or delete the operation",
			s.Failed, strings.Join(failedNames(counted), ", "), r.Budget(), s.Waiting)
	}

	at := transitionTime(op, counted)
	old := s.Conditions
	s.Conditions = nil
	for _, c := range []metav1.Condition{progressing, complete, halted} {
		c.ObservedGeneration = op.Generation
		c.Message = truncate(c.Message, 4096)
		c.LastTransitionTime = at
		for _, o := range old {
			if o.Type == c.Type && o.Status == c.Status && !o.LastTransitionTime.IsZero() {
				c.LastTransitionTime = o.LastTransitionTime
			}
		}
		s.Conditions = append(s.Conditions, c)
	}
}

// transitionTime is when a condition that changes now changed: the latest
// time the counted entries record (the write that changed the summary),
// else the operation's creation, else now.
func transitionTime(op *MachineOperation, counted []MachineOperationTarget) metav1.Time {
	var at metav1.Time
	for _, e := range counted {
		for _, t := range []*metav1.Time{e.StartTime, e.CompletionTime} {
			if t != nil && at.Before(t) {
				at = *t
			}
		}
	}
	switch {
	case !at.IsZero():
		return at
	case !op.CreationTimestamp.IsZero():
		return op.CreationTimestamp
	}
	return metav1.NewTime(time.Now().Truncate(time.Second))
}
