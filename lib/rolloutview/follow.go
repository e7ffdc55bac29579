package rolloutview

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/watch"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// Cluster is what the view reads of the cluster, as a cluster admin.
type Cluster interface {
	GetOperation(ctx context.Context, name string) (*v1alpha1.MachineOperation, error)
	// ListMachines lists the Machines selector matches ("" for all).
	ListMachines(ctx context.Context, selector string) ([]v1alpha1.Machine, error)
	// WatchOperation watches the one operation name from resourceVersion.
	WatchOperation(ctx context.Context, name, resourceVersion string) (watch.Interface, error)
}

// Load reads the operation name and its targets and builds its View.
func Load(ctx context.Context, c Cluster, name string, now time.Time) (View, error) {
	op, err := c.GetOperation(ctx, name)
	if err != nil {
		return View{}, err
	}
	ms, err := machinesOf(ctx, c, op)
	if err != nil {
		return View{}, err
	}
	return Build(op, ms, now), nil
}

// machinesOf lists the Machines op may target: the selector's, or all
// of them for a machineRef operation.
func machinesOf(ctx context.Context, c Cluster, op *v1alpha1.MachineOperation) ([]v1alpha1.Machine, error) {
	selector := ""
	if op.Spec.MachineSelector != nil {
		s, err := op.Spec.MachineSelector.Selector()
		if err != nil {
			return nil, fmt.Errorf("MachineOperation %s: %w", op.Name, err)
		}
		selector = s.String()
	}
	ms, err := c.ListMachines(ctx, selector)
	if err != nil {
		return nil, fmt.Errorf("list the Machines of MachineOperation %s: %w", op.Name, err)
	}
	return ms, nil
}

// FollowOptions tune Follow.
type FollowOptions struct {
	// Refresh is the longest time between two views (times in step go
	// on without a change); default 5s.
	Refresh time.Duration
	// Relist is the shortest time between two Lists of the Machines;
	// default 10s.
	Relist time.Duration
	// Every is the shortest time between two views on changes (a large
	// rollout changes many times a second); default 1s. The view with
	// the outcome is always shown.
	Every time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Follow shows the operation name (show gets a View after every change,
// and at least every Refresh) until it has an outcome, Succeeded or
// Failed (a halt included), and returns the last View. It ends with ctx,
// which bounds it: the error then says the operation was still running.
// A watch the server closes is opened again from the last version seen.
func Follow(ctx context.Context, c Cluster, name string, o FollowOptions, show func(View) error) (View, error) {
	if o.Refresh <= 0 {
		o.Refresh = 5 * time.Second
	}
	if o.Relist <= 0 {
		o.Relist = 10 * time.Second
	}
	if o.Every <= 0 {
		o.Every = time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	op, err := c.GetOperation(ctx, name)
	if err != nil {
		return View{}, err
	}
	var ms []v1alpha1.Machine
	var listed time.Time
	var last View
	var shown time.Time // on the machine's clock, whatever o.Now says
	render := func(force bool) (bool, error) {
		if now := o.Now(); listed.IsZero() || now.Sub(listed) >= o.Relist {
			if ms, err = machinesOf(ctx, c, op); err != nil {
				return false, err
			}
			listed = now
		}
		last = Build(op, ms, o.Now())
		done := last.Outcome() != Running
		if !done && !force && time.Since(shown) < o.Every {
			return false, nil
		}
		shown = time.Now()
		return done, show(last)
	}
	tick := time.NewTicker(o.Refresh)
	defer tick.Stop()
	for {
		if done, err := render(true); done || err != nil {
			return last, err
		}
		w, err := c.WatchOperation(ctx, name, op.ResourceVersion)
		if err != nil {
			return last, stillRunning(ctx, err)
		}
		op, err = follow(ctx, w, op, tick.C, render)
		w.Stop()
		if err != nil || last.Outcome() != Running {
			return last, stillRunning(ctx, err)
		}
		// The server ended the watch (or it expired): read afresh.
		if op, err = c.GetOperation(ctx, name); err != nil {
			return last, stillRunning(ctx, err)
		}
	}
}

// follow renders on each event of w (at most every FollowOptions.Every)
// and each tick, until the operation
// has an outcome, w ends or ctx does; it returns the last operation seen.
func follow(ctx context.Context, w watch.Interface, op *v1alpha1.MachineOperation, tick <-chan time.Time, render func(force bool) (bool, error)) (*v1alpha1.MachineOperation, error) {
	for {
		force := false
		select {
		case <-ctx.Done():
			return op, ctx.Err()
		case <-tick:
			force = true
		case ev, ok := <-w.ResultChan():
			if !ok {
				return op, nil
			}
			switch ev.Type {
			case watch.Deleted:
				return op, fmt.Errorf("MachineOperation %s was deleted", op.Name)
			case watch.Error:
				return op, nil // expired: read afresh
			case watch.Added, watch.Modified:
				next, isOp := ev.Object.(*v1alpha1.MachineOperation)
				if !isOp {
					continue
				}
				*op = *next
			default:
				continue
			}
		}
		done, err := render(force)
		if done || err != nil {
			return op, err
		}
	}
}

// stillRunning says, when ctx ended the wait, that the operation had not
// finished by then.
func stillRunning(ctx context.Context, err error) error {
	if ctx.Err() != nil && (err == nil || errors.Is(err, ctx.Err())) {
		return fmt.Errorf("stopped following: the operation has no outcome yet (%w)", ctx.Err())
	}
	return err
}
