package watcher

// The probation of an upgraded release (requests.Probation): the verdict
// Succeeded comes as soon as the upgrader's health gate passed and the new
// watcher synced; the release then stays on probation for
// Options.UpgradeProbation, during which last-good still names the release
// it came from, so the recovery unit rolls a failing watcher back. This file
// decides when a probation ends and publishes a rollback that ended one.

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/release"
	"github.com/kubeslot/kubeslot/lib/requests"
)

// EventUpgradeRolledBack is the reason of the Event on the Machine when a
// release reported Succeeded was rolled back while on probation.
const EventUpgradeRolledBack = "UpgradeRolledBack"

// probation decides what the probation file asks of this watcher:
//   - rolled back (the recovery unit recorded it, or current no longer names
//     the release: only a rollback moves current away from a release on
//     probation, since an upgrader ends a probation before its switch):
//     publish that, once the Machine exists;
//   - this watcher runs the release and has been up for the window, or
//     last-good names it already (a crash after advancing it): end it;
//   - anything else (the window not over, a watcher of another version
//     between a switch and its re-exec): wait.
func probation(in Inputs) (Action, bool) {
	p := in.Probation
	switch {
	case p == nil:
		return Action{}, false
	case in.Upgrade != nil && in.Upgrade.RequestID == p.RequestID && in.Upgrade.Failure != "" && !finished(in, p.RequestID):
		// Killed between the probation file and the Succeeded status, then
		// rolled back: the verdict is the signal's Failed; nothing was
		// reported Succeeded, so there is no rollback after it to report.
		return Action{Type: EndProbation, Probation: p}, true
	case p.Reason != "" || (in.Current != "" && in.Current != p.ToRelease):
		if in.Machine == nil || rollbackAwaitsStatus(in, p.RequestID) {
			return Action{}, false // reported once the Machine is there, after the Succeeded it undoes
		}
		return Action{Type: ReportRollback, Probation: p}, true
	case in.AgentVersion != p.ToVersion:
		return Action{}, false
	case in.LastGood == p.ToRelease:
		return Action{Type: EndProbation, Probation: p}, true
	case in.ProbationOver:
		return Action{Type: EndProbation, Probation: p, Advance: true}, true
	}
	return Action{}, false
}

// rollbackAwaitsStatus reports whether a status of request id is on disk
// and not yet published: the rollback after a Succeeded is published after
// that Succeeded, which would otherwise set AgentUpgraded True again over the
// rollback's False (a watcher killed between writing and publishing it).
func rollbackAwaitsStatus(in Inputs, id string) bool {
	for _, s := range in.Statuses {
		if s.RequestID == id && in.Published[id] != s.Phase {
			return true
		}
	}
	return false
}

// finished reports whether a final status of request id is on disk.
func finished(in Inputs, id string) bool {
	for _, s := range in.Statuses {
		if s.RequestID == id && s.Phase.Finished() {
			return true
		}
	}
	return false
}

// probationWaits reports whether the probation in in waits only for this
// watcher's window: the loop then decides again when that has passed.
func probationWaits(in Inputs) bool {
	p := in.Probation
	if p == nil {
		return false
	}
	return p.Reason == "" && (in.Current == "" || in.Current == p.ToRelease) &&
		in.AgentVersion == p.ToVersion && in.LastGood != p.ToRelease && !in.ProbationOver
}

// rollbackMessage is what the Machine, the operation and the Event say.
func rollbackMessage(p *requests.Probation, current string) string {
	why := p.Reason
	if why == "" {
		why = fmt.Sprintf("release %s is no longer current (%s is)", p.ToRelease, current)
	}
	return fmt.Sprintf("agent upgrade %s -> %s was reported Succeeded at %s, then rolled back to %s while on probation: %s",
		p.FromVersion, p.ToVersion, p.SucceededAt.UTC().Format(time.RFC3339), p.FromVersion, why)
}

// endProbation moves last-good to the release that passed its probation
// (when a.Advance) and removes the file; killed in between, the next
// watcher finds last-good moved and only removes the file. No lock: the
// upgrader moves last-good only to the running release, which is this one,
// and the recovery unit only reads it after this watcher failed.
func (l *loop) endProbation(in Inputs, a Action) error {
	p := a.Probation
	if a.Advance {
		if err := release.SetLastGood(l.Root, p.ToRelease); err != nil {
			return fmt.Errorf("advance last-good to %s: %w", p.ToRelease, err)
		}
		l.Log.Info("the upgraded release passed its probation; last-good now names it", "request", p.RequestID,
			"release", p.ToRelease, "version", p.ToVersion, "up", time.Since(l.Started).Round(time.Millisecond))
	}
	return l.dir.RemoveProbation()
}

// reportRollback publishes a rollback after Succeeded: on the operation's
// entry for this Machine (when the operation and the entry still exist), as
// the Machine's AgentUpgraded condition and as an Event, then removes the
// file. Killed before the removal, it is published again: the entry and
// the condition are idempotent, the Event may repeat.
func (l *loop) reportRollback(ctx context.Context, in Inputs, a Action) error {
	p := a.Probation
	msg := rollbackMessage(p, in.Current)
	at := p.RolledBackAt
	if at.IsZero() {
		at = p.UpdatedAt
	}
	if p.Operation != "" {
		if err := l.markOperationRolledBack(ctx, p.Operation, at, msg); err != nil {
			return err
		}
	}
	c := cond(v1alpha1.ConditionAgentUpgraded, false, v1alpha1.ReasonRolledBackOnProbation, msg, p.MachineGeneration)
	if err := l.setCondition(ctx, c); err != nil {
		return err
	}
	l.rollbackEvent(ctx, in.Machine, msg)
	l.Log.Warn("published a rollback after Succeeded", "request", p.RequestID, "message", msg)
	return l.dir.RemoveProbation()
}

// markOperationRolledBack sets the rolledBack field of this Machine's entry
// in operation name; an operation or entry that is gone is nothing to mark.
func (l *loop) markOperationRolledBack(ctx context.Context, name string, at time.Time, msg string) error {
	rb := &v1alpha1.OperationRollback{Time: metav1.NewTime(at).Rfc3339Copy(), Reason: v1alpha1.ReasonRolledBackOnProbation,
		Message: msg}
	if len(rb.Message) > 4096 {
		rb.Message = rb.Message[:4096]
	}
	_, err := l.mc.UpdateOperationStatus(ctx, name, func(op *v1alpha1.MachineOperation) error {
		cur := op.Status.Target(l.MachineName, l.NodeName)
		if cur == nil || (cur.RolledBack != nil && cur.RolledBack.Message == rb.Message) {
			return errNoChange
		}
		cur.RolledBack = rb
		return nil
	})
	if apierrors.IsNotFound(errors.Unwrap(err)) || apierrors.IsNotFound(err) {
		l.Log.Info("operation gone; rollback after Succeeded not recorded on it", "operation", name)
		return nil
	}
	return err
}

// rollbackEvent records the rollback on the Machine; best effort, as event.
func (l *loop) rollbackEvent(ctx context.Context, m *v1alpha1.Machine, msg string) {
	l.postEvent(ctx, m, eventTypeWarning, EventUpgradeRolledBack, msg)
}
