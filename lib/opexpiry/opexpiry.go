// Package opexpiry applies spec.ttlSecondsAfterFinished from the cluster's
// side: it deletes a finished MachineOperation once its time has passed.
// Agents expire only operations that name their own Machine (machineRef):
// admission can check that, but not whether a node is a target of a
// selector operation, so no node may delete one, and the cluster admin's
// `kubeslot cluster expire` does it here. Whether an operation is finished
// is computed from the entries of its real targets (enrolled Machines with
// that node name), never from the summary nodes write. Imported by
// cmd/kubeslot.
package opexpiry

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// Cluster is what the expiry needs of the cluster.
type Cluster interface {
	ListOperations(ctx context.Context) ([]v1alpha1.MachineOperation, error)
	// ListMachines lists the Machines selector matches ("" for all).
	ListMachines(ctx context.Context, selector string) ([]v1alpha1.Machine, error)
	// DeleteOperation deletes name only while it is still uid at
	// resourceVersion (404 and 409 otherwise).
	DeleteOperation(ctx context.Context, name string, uid types.UID, resourceVersion string) error
}

// Expired is an operation Run deleted (or found gone).
type Expired struct {
	Name string
	// Finished is the verified completion time; TTL the operation's.
	Finished time.Time
	TTL      time.Duration
}

// Run deletes every operation whose verified completion time plus its
// spec.ttlSecondsAfterFinished is not after now. It returns what it
// deleted and the earliest later expiry (zero when none), for a caller
// that runs it again then.
func Run(ctx context.Context, c Cluster, now time.Time, log *slog.Logger) ([]Expired, time.Time, error) {
	ops, err := c.ListOperations(ctx)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("list MachineOperations: %w", err)
	}
	slices.SortFunc(ops, func(a, b v1alpha1.MachineOperation) int { return strings.Compare(a.Name, b.Name) })
	var done []Expired
	var next time.Time
	var errs []string
	all := &allMachines{c: c}
	for i := range ops {
		op := &ops[i]
		ttl := op.Spec.TTLSecondsAfterFinished
		if ttl == nil || *ttl < 0 || op.DeletionTimestamp != nil {
			continue
		}
		check, err := targets(ctx, c, all, op)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		v := v1alpha1.Verified(op, check)
		if !v.Phase.Finished() || v.CompletionTime == nil {
			continue
		}
		x := Expired{Name: op.Name, Finished: v.CompletionTime.Time, TTL: time.Duration(*ttl) * time.Second}
		if at := x.Finished.Add(x.TTL); at.After(now) {
			if next.IsZero() || at.Before(next) {
				next = at
			}
			continue
		}
		err = c.DeleteOperation(ctx, op.Name, op.UID, op.ResourceVersion)
		switch {
		case err == nil, apierrors.IsNotFound(err):
			log.Info("deleted a finished operation: its ttlSecondsAfterFinished passed", "operation", op.Name,
				"finished", x.Finished.UTC().Format(time.RFC3339), "ttl", x.TTL)
			done = append(done, x)
		case apierrors.IsConflict(err):
			log.Info("operation changed since it was read; looked at again on the next run", "operation", op.Name)
		default:
			errs = append(errs, fmt.Sprintf("delete MachineOperation %s: %v", op.Name, err))
		}
	}
	if len(errs) > 0 {
		return done, next, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return done, next, nil
}

// targets is op's entry check: the entries of the Machines op targets,
// each under the node name its Machine has.
func targets(ctx context.Context, c Cluster, all *allMachines, op *v1alpha1.MachineOperation) (func(v1alpha1.MachineOperationTarget) bool, error) {
	var ms []v1alpha1.Machine
	var err error
	switch {
	case op.Spec.MachineSelector != nil:
		s, serr := op.Spec.MachineSelector.Selector()
		if serr != nil {
			return nil, fmt.Errorf("MachineOperation %s: %w", op.Name, serr)
		}
		ms, err = c.ListMachines(ctx, s.String())
	case op.Spec.MachineRef != nil:
		ms, err = all.get(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("list the Machines of MachineOperation %s: %w", op.Name, err)
	}
	return v1alpha1.TargetNodesOf(op, ms).Check, nil
}

// allMachines lists every Machine once per run, for the operations that
// name theirs (machineRef).
type allMachines struct {
	c    Cluster
	ms   []v1alpha1.Machine
	done bool
}

func (a *allMachines) get(ctx context.Context) ([]v1alpha1.Machine, error) {
	if !a.done {
		ms, err := a.c.ListMachines(ctx, "")
		if err != nil {
			return nil, err
		}
		a.ms, a.done = ms, true
	}
	return a.ms, nil
}
