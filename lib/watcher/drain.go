package watcher

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	nodedrain "github.com/kubeslot/kubeslot/lib/drain"
	"github.com/kubeslot/kubeslot/lib/requests"
)

// disruptionOf is the Machine's drain policy, carried in each repave and
// restart request (nil: the worker's defaults). It is not part of the
// desired configuration, so changing it repaves nothing.
func disruptionOf(m *v1alpha1.Machine) *nodedrain.Policy {
	d := m.Spec.Disruption
	if d == nil {
		return nil
	}
	return &nodedrain.Policy{Skip: d.Drain == v1alpha1.DrainNone, Timeout: time.Duration(d.DrainTimeoutSeconds) * time.Second,
		OnTimeout: nodedrain.Action(d.OnDrainTimeout), DeleteEmptyDirData: d.DeleteEmptyDirData,
		PDBPreflight: nodedrain.PreflightAction(d.PDBPreflight)}
}

// drainingCondition is the Draining condition from the newest status that
// has a drain: True while it runs (Draining, or DrainBlocked naming the
// budget), False with how it ended. None before the first drain.
func drainingCondition(in Inputs, gen int64) (metav1.Condition, bool) {
	var s *requests.Status
	for _, x := range in.Statuses {
		if x.Drain != nil && (s == nil || x.UpdatedAt.After(s.UpdatedAt)) {
			s = x
		}
	}
	if s == nil {
		return metav1.Condition{}, false
	}
	p := s.Drain
	if !p.Done && !s.Phase.Finished() {
		reason := v1alpha1.ReasonDraining
		if p.BlockingPDB != "" {
			reason = v1alpha1.ReasonDrainBlocked
		}
		return cond(v1alpha1.ConditionDraining, true, reason, p.Message, gen), true
	}
	reason := v1alpha1.ReasonDrained
	switch p.Outcome {
	case nodedrain.Failed:
		reason = v1alpha1.ReasonDrainFailed
	case nodedrain.Forced:
		reason = v1alpha1.ReasonDrainForced
	case "":
		if !p.Done { // the worker ended in the middle of the drain
			reason = v1alpha1.ReasonDrainFailed
		}
	}
	return cond(v1alpha1.ConditionDraining, false, reason, p.Message, gen), true
}

// drainEvent is the Event for a change of the Draining condition from old
// (nil: none) to c; ok is false when nothing a person would read changed.
func drainEvent(old *metav1.Condition, c metav1.Condition) (typ, reason, msg string, ok bool) {
	if old != nil && old.Status == c.Status && old.Reason == c.Reason && old.Message == c.Message {
		return "", "", "", false
	}
	typ = eventTypeNormal
	if c.Reason == v1alpha1.ReasonDrainBlocked || c.Reason == v1alpha1.ReasonDrainFailed || c.Reason == v1alpha1.ReasonDrainForced {
		typ = eventTypeWarning
	}
	return typ, c.Reason, c.Message, true
}
