package repave

import (
	"context"
	"fmt"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/drain"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/requests"
)

// uncordonTimeout bounds the uncordon after the node is healthy again.
const uncordonTimeout = 30 * time.Second

// drainPolicy is the request's policy (nil: the defaults), its timeout
// shortened to what the stage's budget leaves after the worst case of the
// rest of the run (config.StageBudget), so that systemd never stops a run
// within its limits; note says when it was shortened.
func drainPolicy(p *drain.Policy, cfg *config.Config, download bool) (pol drain.Policy, note string) {
	if p != nil {
		pol = *p
	}
	or := func(d config.Duration, def time.Duration) time.Duration {
		if d.Duration > 0 {
			return d.Duration
		}
		return def
	}
	t := cfg.Timeouts
	worst := or(t.Lock, config.DefaultLock) + 2*(or(t.Stop, config.DefaultStop)+or(t.NodeReady, config.DefaultNodeReady))
	if download {
		worst += or(t.Download, config.DefaultDownload)
	}
	left := max(config.StageBudget-worst, time.Second)
	want := pol.Timeout
	if want <= 0 {
		want = drain.DefaultTimeout
	}
	if want > left {
		pol.Timeout = left
		note = fmt.Sprintf("drain timeout %s shortened to %s: the rest of the run may take %s of the stage's %s (lower the [timeouts])",
			want, left, worst, config.StageBudget)
	}
	return pol, note
}

// drainer is the node's Drainer for cfg, reporting its progress into st
// (nil: none) and the status file.
func (d *Deps) drainer(cfg *config.Config, progress func(drain.Progress)) (*drain.Drainer, error) {
	c, err := d.Drain(cfg)
	if err != nil {
		return nil, fmt.Errorf("drain: the node's cluster client: %w", err)
	}
	return &drain.Drainer{Cluster: c, Node: cfg.Machine.NodeName, Log: d.Log, Progress: progress, Poll: d.DrainPoll}, nil
}

// drainOld cordons the node and evicts its pods while the old node still
// serves and the target is warm: a failure (time out under Fail, pods it
// may not evict) rolls back before the old node is touched, and the
// rollback uncordons. A drain resumed after a kill finds its own cordon.
// A paced rollout's request whose slot the watcher lost stops here, before
// the first disruption (requests.CheckSlot).
func (d *Deps) drainOld(ctx context.Context, st *State, _ isolation.Backend) error {
	if err := d.Requests.CheckSlot(st.RequestID); err != nil {
		return err
	}
	if st.SkipDrain {
		d.Log.Info("drain skipped (--no-drain)")
		return nil
	}
	pol, note := drainPolicy(st.Disruption, st.Desired, true)
	if note != "" {
		d.Log.Warn(note)
	}
	dr, err := d.drainer(st.Desired, func(p drain.Progress) {
		st.Drain = &p
		if err := d.Requests.WriteStatus(d.status(st, requests.InProgress, p.Message)); err != nil {
			d.Log.Warn("could not write progress", "err", err)
		}
	})
	if err != nil {
		return err
	}
	res, err := dr.Drain(ctx, pol, st.RequestID)
	if err != nil {
		return err
	}
	if res.Forced {
		st.Warning = joinWarning(st.Warning, res.Message)
	}
	return saveState(d.Root, st)
}

// uncordonNode gives the node back to the scheduler once it is healthy
// again (after verify, or the rollback's verify), if kubeslot cordoned it.
// Best effort and bounded: the node runs and is Ready; a failure is a
// warning in the status.
func (d *Deps) uncordonNode(ctx context.Context, st *State, cfg *config.Config) {
	if st.SkipDrain {
		return
	}
	wait := d.UncordonWait
	if wait <= 0 {
		wait = uncordonTimeout
	}
	uctx, cancel := context.WithTimeoutCause(ctx, wait, fmt.Errorf("not uncordoned within %s", wait))
	defer cancel()
	dr, err := d.drainer(cfg, nil)
	if err == nil {
		err = dr.Uncordon(uctx)
	}
	if err != nil {
		d.Log.Warn("could not uncordon the Node", "node", cfg.Machine.NodeName, "err", err)
		st.Warning = joinWarning(st.Warning, "the Node was not uncordoned: "+err.Error())
	}
}

func (d *Deps) uncordon(ctx context.Context, st *State, _ isolation.Backend) error {
	d.uncordonNode(ctx, st, st.Desired)
	return saveState(d.Root, st)
}

func joinWarning(w, more string) string {
	if w == "" || more == "" {
		return w + more
	}
	return w + "; " + more
}
