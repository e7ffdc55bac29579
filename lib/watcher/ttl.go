package watcher

// spec.ttlSecondsAfterFinished: the watcher deletes a finished operation
// that names its Machine (machineRef) once completionTime + ttl has passed;
// selector operations are the cluster side's to expire (lib/opexpiry), as
// admission lets no node delete one. Expiries decides
// (pure); expire deletes what is due and arms one timer for the next expiry,
// so an idle watcher makes no API request for this. Every target's watcher
// of a selector operation races to delete it: the delete names the UID and
// resourceVersion read, and 404/409 means another one won (or the object
// changed, and its watch event brings a new decision).
//
// The admission policy (lib/api/v1alpha1/access) lets a node delete only a
// finished operation with a TTL that has an entry of its own Machine; CEL
// has no clock, so the TTL itself is kept here and not enforced there.

import (
	"context"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// Expiry is a finished operation this watcher deletes at At.
type Expiry struct {
	Name            string
	UID             types.UID
	ResourceVersion string
	TTL             time.Duration
	// At is status.completionTime + spec.ttlSecondsAfterFinished.
	At time.Time
}

// Expiries returns the operations of ops that this watcher (node, Machine
// m) deletes: those with spec.ttlSecondsAfterFinished, finished (phase
// Succeeded or Failed, with completionTime), not being deleted already, and
// with a finished entry of m on node in status.machines (for a machineRef
// operation, m must be the one it names). This is what the admission policy
// allows a node, plus the entry being finished: a watcher never deletes an
// operation its own worker still runs. due are those whose time has come
// (At not after now), oldest first; next is the earliest At after now, zero
// when there is none. Nothing is due without a Machine of this node.
func Expiries(ops []v1alpha1.MachineOperation, m *v1alpha1.Machine, node string, now time.Time) (due []Expiry, next time.Time) {
	if m == nil || m.Spec.NodeName != node {
		return nil, time.Time{}
	}
	for i := range ops {
		op := &ops[i]
		ttl, st := op.Spec.TTLSecondsAfterFinished, &op.Status
		switch {
		case ttl == nil || *ttl < 0, !st.Phase.Finished(), st.CompletionTime == nil, op.DeletionTimestamp != nil:
			continue
		case op.Spec.MachineRef == nil:
			continue // a selector operation: the cluster side expires it (lib/opexpiry)
		case op.Spec.MachineRef.Name != m.Name:
			continue // another Machine's
		}
		if e := st.Target(m.Name, node); e == nil || !e.Phase.Finished() {
			continue // this Machine took no part, or its part is not over
		}
		x := Expiry{Name: op.Name, UID: op.UID, ResourceVersion: op.ResourceVersion,
			TTL: time.Duration(*ttl) * time.Second}
		x.At = st.CompletionTime.Add(x.TTL)
		if x.At.After(now) {
			if next.IsZero() || x.At.Before(next) {
				next = x.At
			}
			continue
		}
		due = append(due, x)
	}
	slices.SortFunc(due, func(a, b Expiry) int {
		if c := a.At.Compare(b.At); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return due, next
}

// ttlRetry is how long a delete that failed for a passing reason (the
// cluster unreachable, a timeout, 5xx) waits before it is tried again.
const ttlRetry = 30 * time.Second

// ttlSlack is added to the timer so that it fires after the expiry, not a
// hair before it.
const ttlSlack = 20 * time.Millisecond

// ttlState is the loop's memory for expire: the one timer, and the deletes
// that failed, by UID, with the resourceVersion they failed for.
type ttlState struct {
	timer  *time.Timer
	failed map[types.UID]ttlFailure
}

type ttlFailure struct {
	resourceVersion string
	// retryAt is when to try again; zero: not before the object changes
	// (the apiserver refused this version, e.g. 403 from the policy).
	retryAt time.Time
}

func (s *ttlState) stop() {
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
}

// verifiedSummaries returns in.Operations, each with its phase vetoed by
// the entries this agent counts (in.Checks) and its own: a summary is
// written by agents, and one under a forged entry could say "finished"
// early, which must not make this watcher delete the operation. Only a
// veto: with fewer entries verified than written (no List yet), the
// stored summary still says "not finished" where it knows better.
func verifiedSummaries(in Inputs) []v1alpha1.MachineOperation {
	out := make([]v1alpha1.MachineOperation, len(in.Operations))
	for i := range in.Operations {
		out[i] = *in.Operations[i].DeepCopy()
		own := out[i].Status.Target(in.MachineName, in.NodeName)
		if own == nil || !out[i].Status.Phase.Finished() {
			continue
		}
		v := out[i].DeepCopy()
		v1alpha1.SetMachineResult(v, *own, in.Checks[v.Name])
		if !v.Status.Phase.Finished() {
			out[i].Status.Phase = v.Status.Phase
		}
	}
	return out
}

// expire deletes the operations Expiries says are due and arms the timer
// for the next expiry (or retry). It makes no request when nothing is due.
func (l *loop) expire(ctx context.Context, in Inputs) {
	now := time.Now()
	due, next := Expiries(verifiedSummaries(in), in.Machine, in.NodeName, now)
	if l.ttl.failed == nil {
		l.ttl.failed = map[types.UID]ttlFailure{}
	}
	// Forget failures of operations no longer there.
	live := map[types.UID]bool{}
	for i := range in.Operations {
		live[in.Operations[i].UID] = true
	}
	for uid := range l.ttl.failed {
		if !live[uid] {
			delete(l.ttl.failed, uid)
		}
	}
	earliest := func(t time.Time) {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	for _, x := range due {
		if f, ok := l.ttl.failed[x.UID]; ok && f.resourceVersion == x.ResourceVersion {
			if f.retryAt.IsZero() {
				continue
			}
			if now.Before(f.retryAt) {
				earliest(f.retryAt)
				continue
			}
		}
		if f := l.deleteExpired(ctx, x, now); f != nil {
			l.ttl.failed[x.UID] = *f
			earliest(f.retryAt)
		} else {
			delete(l.ttl.failed, x.UID)
		}
	}
	l.ttl.stop()
	if !next.IsZero() {
		l.ttl.timer = time.AfterFunc(time.Until(next)+ttlSlack, l.nudge)
	}
}

// deleteExpired deletes one due operation; it returns nil when the
// operation is gone (deleted here or by another target's watcher) or
// changed since it was read, else what to remember of the failure.
func (l *loop) deleteExpired(ctx context.Context, x Expiry, now time.Time) *ttlFailure {
	ctx, cancel := context.WithTimeout(ctx, l.CallTimeout)
	defer cancel()
	err := l.mc.DeleteFinishedOperation(ctx, x.Name, x.UID, x.ResourceVersion)
	switch {
	case err == nil:
		l.Log.Info("deleted a finished operation: its ttlSecondsAfterFinished passed", "operation", x.Name,
			"ttl", x.TTL, "finished", x.At.Add(-x.TTL).UTC().Format(time.RFC3339), "late", now.Sub(x.At).Round(time.Millisecond))
		return nil
	case apierrors.IsNotFound(err):
		l.Log.Debug("expired operation already deleted", "operation", x.Name)
		return nil
	case apierrors.IsConflict(err):
		// Re-created under the same name, or changed: the watch brings
		// the new version, and a new decision.
		l.Log.Debug("expired operation changed since read; not deleted", "operation", x.Name, "err", err.Error())
		return nil
	case apierrors.IsForbidden(err) || apierrors.IsBadRequest(err) || apierrors.IsInvalid(err):
		l.Log.Warn("cannot delete an expired operation; not retried until it changes", "operation", x.Name,
			"ttl", x.TTL, "err", err.Error())
		return &ttlFailure{resourceVersion: x.ResourceVersion}
	}
	l.Log.Warn("cannot delete an expired operation; will retry", "operation", x.Name, "in", ttlRetry, "err", err.Error())
	return &ttlFailure{resourceVersion: x.ResourceVersion, retryAt: now.Add(ttlRetry)}
}
