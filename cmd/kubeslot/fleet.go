package main

import (
	"context"
	"fmt"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/clusterinstall"
	"github.com/kubeslot/kubeslot/lib/machineclient"
	"github.com/kubeslot/kubeslot/lib/opexpiry"
)

// clusterExpireCmd applies spec.ttlSecondsAfterFinished from the cluster's
// side (lib/opexpiry): the agents expire only the operations that name
// their own Machine, since admission lets no node delete a selector
// operation.
type clusterExpireCmd struct {
	clusterFlags
	Watch    bool          `help:"Keep running: look again at each next expiry, and at least every --interval."`
	Interval time.Duration `help:"With --watch, the longest time between two looks." default:"1m"`
}

func (c *clusterExpireCmd) Run(e *env) error {
	cfg, log, err := c.setup(e)
	if err != nil {
		return err
	}
	if c.Interval < time.Second {
		return fmt.Errorf("--interval %s: must be at least 1s", c.Interval)
	}
	mc, err := machineclient.New(cfg)
	if err != nil {
		return err
	}
	cl := expireCluster{mc}
	once := func(ctx context.Context) (time.Time, error) {
		ctx, cancel := context.WithTimeout(ctx, c.Timeout)
		defer cancel()
		done, next, err := opexpiry.Run(ctx, cl, time.Now(), log)
		for _, x := range done {
			fmt.Fprintf(e.io.Stdout, "deleted   %s (finished %s, ttlSecondsAfterFinished %d)\n", x.Name,
				x.Finished.UTC().Format(time.RFC3339), int(x.TTL.Seconds()))
		}
		return next, err
	}
	if !c.Watch {
		_, err := once(context.Background())
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	for {
		next, err := once(ctx)
		if err != nil {
			log.Warn("expiry pass incomplete; tried again at the next one", "err", err.Error())
		}
		wait := c.Interval
		if !next.IsZero() {
			wait = min(wait, max(time.Until(next), 0)+time.Second)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// expireCluster is opexpiry.Cluster over machineclient.
type expireCluster struct{ mc *machineclient.Client }

func (c expireCluster) ListOperations(ctx context.Context) ([]v1alpha1.MachineOperation, error) {
	l, err := c.mc.ListOperations(ctx)
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

func (c expireCluster) ListMachines(ctx context.Context, selector string) ([]v1alpha1.Machine, error) {
	l := &v1alpha1.MachineList{}
	req := c.mc.REST().Get().Resource(v1alpha1.MachinesResource)
	if selector != "" {
		req = req.Param("labelSelector", selector)
	}
	if err := req.Do(ctx).Into(l); err != nil {
		return nil, fmt.Errorf("list Machines: %w", err)
	}
	return l.Items, nil
}

func (c expireCluster) DeleteOperation(ctx context.Context, name string, uid types.UID, rv string) error {
	return c.mc.DeleteFinishedOperation(ctx, name, uid, rv)
}

// clusterEnrollCmd makes nodes and their Machines members of the fleet, or
// takes them out (lib/clusterinstall.Enroll).
type clusterEnrollCmd struct {
	clusterFlags
	Remove   bool     `help:"Take them out of the fleet instead."`
	Machines []string `arg:"" name:"machine" help:"Machines to enroll; a name with no Machine yet is a node's (its agent registers its Machine under that name)."`
}

func (c *clusterEnrollCmd) Run(e *env) error {
	cfg, log, err := c.setup(e)
	if err != nil {
		return err
	}
	ctx, cancel := c.context()
	defer cancel()
	done, err := clusterinstall.Enroll(ctx, cfg, c.Machines, !c.Remove, log)
	for _, d := range done {
		fmt.Fprintln(e.io.Stdout, d)
	}
	return err
}
