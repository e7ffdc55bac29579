package watcher

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

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

// Uncordon makes the Node schedulable again: a worker's cordon
// (Action.Status is the finished request that cordoned it) outlived its
// run, e.g. a failed drain whose rollback could not reach the cluster to
// uncordon.
const Uncordon ActionType = "Uncordon"

// leftCordoned is the Uncordon for a Node cordoned by a request that has
// finished (its final status is on disk) while no repave or restart is
// pending, claimed or being written: nothing will uncordon it otherwise. A
// cordon by a request still running, or by someone else (no annotation), is
// left alone.
func leftCordoned(in Inputs, d *dispatch) (Action, bool) {
	if in.NodeCordonedBy == "" || len(d.reqs) > 0 {
		return Action{}, false
	}
	for _, k := range []requests.Kind{requests.Repave, requests.Restart} {
		if in.Pending[k] != nil || in.Claimed[k] != nil {
			return Action{}, false
		}
	}
	for _, s := range in.Statuses {
		if s.RequestID == in.NodeCordonedBy && s.Phase.Finished() {
			return Action{Type: Uncordon, Status: s}, true
		}
	}
	return Action{}, false
}

// uncordon carries out Uncordon as the node itself (NodeRestriction lets it
// patch its own Node): spec.unschedulable false and kubeslot's annotation
// gone, only while the annotation still names the finished request (a JSON
// patch test), so a newer cordon is never undone. An Event says why.
func (l *loop) uncordon(ctx context.Context, in Inputs, a Action) error {
	id := a.Status.RequestID
	key := "/metadata/annotations/" + strings.ReplaceAll(strings.ReplaceAll(nodedrain.Annotation, "~", "~0"), "/", "~1")
	patch, err := json.Marshal([]map[string]any{
		{"op": "test", "path": key, "value": id},
		{"op": "remove", "path": key},
		{"op": "replace", "path": "/spec/unschedulable", "value": false},
	})
	if err != nil {
		return err
	}
	err = l.core.Patch(types.JSONPatchType).Resource("nodes").Name(l.NodeName).Body(patch).Do(ctx).Error()
	if apierrors.IsInvalid(err) || apierrors.IsNotFound(err) {
		return nil // cordoned anew meanwhile (the test failed), or no Node: nothing of ours to undo
	}
	if err != nil {
		return fmt.Errorf("uncordon node %s, left cordoned by %s (%s): %w", l.NodeName, id, a.Status.Phase, err)
	}
	msg := fmt.Sprintf("uncordoned node %s: the cordon of %s %s outlived it (%s)", l.NodeName, a.Status.Kind, id, a.Status.Phase)
	l.Log.Warn(msg)
	if in.Machine != nil {
		l.postEvent(ctx, in.Machine, eventTypeWarning, "UncordonedLeftover", msg)
	}
	return nil
}
