package repave

import (
	"context"
	"errors"
	"fmt"
	"github.com/kubeslot/kubeslot/lib/cachekeep"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/state"
)

// ErrRolledBack wraps the failure of a repave that was rolled back: the old
// slot's node is Ready again and nothing was committed.
var ErrRolledBack = errors.New("repave rolled back")

// NewState starts a transition of request id (operation op, Machine
// generation gen) from slot from to slot to with desired.
func NewState(d *Deps, id, op string, gen int64, from, to string, desired *config.Config) *State {
	return &State{RequestID: id, Operation: op, MachineGeneration: gen, From: from, To: to,
		Desired: desired, Phase: Prepare, StartedAt: d.now().UTC()}
}

func (d *Deps) status(st *State, phase requests.Phase, msg string) *requests.Status {
	return &requests.Status{RequestID: st.RequestID, Kind: requests.Repave, Operation: st.Operation,
		MachineGeneration: st.MachineGeneration, Phase: phase, Message: msg, Phases: st.Phases}
}

// Run drives the transition st from its recorded phase to the end and
// writes the final status. It returns that status and, when the repave
// failed, an error (wrapping ErrRolledBack after a rollback). An error from
// the Hook, or a failure in commit, clean or rollback, leaves the state file
// for a resume.
func Run(ctx context.Context, d *Deps, st *State) (*requests.Status, error) {
	log := d.Log.With("request", st.RequestID, "from", st.From, "to", st.To)
	for {
		if err := saveState(d.Root, st); err != nil {
			return nil, err
		}
		if d.Hook != nil {
			if err := d.Hook(ctx, st.Phase); err != nil {
				return nil, err
			}
		}
		if err := d.Requests.WriteStatus(d.status(st, requests.InProgress, "repave "+st.From+" -> "+st.To+": "+string(st.Phase))); err != nil {
			log.Warn("could not write progress", "err", err)
		}
		t0 := d.now()
		log.Info("repave phase", "phase", st.Phase)
		err := d.runPhase(ctx, st)
		st.Phases = append(st.Phases, requests.PhaseTiming{Name: string(st.Phase), StartedAt: t0.UTC(), Duration: d.now().Sub(t0)})
		log.Info("repave phase done", "phase", st.Phase, "took", d.now().Sub(t0).Round(time.Millisecond), "err", err)
		if err != nil && ctx.Err() != nil {
			// Stopped (SIGTERM: a shutdown, systemctl stop), not failed: no
			// rollback and no final status. The state file keeps the phase,
			// and the next start resumes it (issue 16, item 7).
			return nil, fmt.Errorf("repave %s -> %s stopped in %s (%v); the next start resumes it", st.From, st.To, st.Phase, context.Cause(ctx))
		}
		switch {
		case err == nil && st.Phase == Rollback:
			st.Phase = RollbackVerify
		case err == nil && st.Phase == RollbackVerify:
			msg := fmt.Sprintf("repave to slot %s failed in %s: %s; rolled back to slot %s, its node is Ready", st.To, st.FailedIn, st.Reason, st.From)
			var down time.Duration
			if !st.SwitchAt.IsZero() { // the old node was stopped: down until it was Ready again
				down = d.now().Sub(st.SwitchAt)
			}
			return d.finish(st, requests.Failed, msg, st.From, down, fmt.Errorf("%w: %s", ErrRolledBack, msg))
		case err == nil && st.Phase == Clean:
			var down time.Duration
			for _, p := range st.Phases {
				if p.Name == string(Verify) {
					down = p.StartedAt.Add(p.Duration).Sub(st.SwitchAt)
				}
			}
			msg := fmt.Sprintf("repaved from slot %s to slot %s", st.From, st.To)
			if st.Warning != "" {
				msg += "; " + st.Warning
			}
			return d.finish(st, requests.Succeeded, msg, st.To, down, nil)
		case err == nil:
			st.Phase = st.Phase.next()
		case st.Phase == Prepare:
			// The old node was never touched: nothing to roll back.
			msg := fmt.Sprintf("repave to slot %s failed in prepare (the node on slot %s kept running): %v", st.To, st.From, err)
			return d.finish(st, requests.Failed, msg, st.From, 0, errors.New(msg))
		case st.Phase == Switch || st.Phase == Start || st.Phase == Verify:
			log.Error("repave failed; rolling back", "phase", st.Phase, "err", err)
			st.FailedIn, st.Reason, st.Phase = st.Phase, err.Error(), Rollback
		default:
			// commit, clean, rollback: the state stays; a re-run retries.
			msg := fmt.Sprintf("repave %s -> %s: %s: %v (a re-run resumes it)", st.From, st.To, st.Phase, err)
			if werr := d.Requests.WriteStatus(d.status(st, requests.InProgress, msg)); werr != nil {
				log.Warn("could not write progress", "err", werr)
			}
			return nil, errors.New(msg)
		}
	}
}

func (d *Deps) finish(st *State, phase requests.Phase, msg, active string, down time.Duration, err error) (*requests.Status, error) {
	s := d.status(st, phase, msg)
	s.ActiveSlot, s.Downtime = active, down
	if werr := d.Requests.WriteStatus(s); werr != nil {
		return s, errors.Join(err, fmt.Errorf("write status: %w", werr))
	}
	if rerr := removeState(d.Root); rerr != nil {
		return s, errors.Join(err, rerr)
	}
	return s, err
}

func (d *Deps) runPhase(ctx context.Context, st *State) error {
	target, err := d.backend(st.Desired)
	if err != nil {
		return err
	}
	switch st.Phase {
	case Prepare:
		// Refused by the version skew policy before anything is fetched;
		// then the kubelet the version names, pinned in the state so that
		// a resume installs the same file.
		if err := d.checkSkew(ctx, st.Desired); err != nil {
			return err
		}
		if err := d.checkSandboxImage(ctx, st); err != nil {
			return err
		}
		if err := d.Releases.Pin(ctx, st.Desired); err != nil {
			return err
		}
		if err := saveState(d.Root, st); err != nil {
			return err
		}
		if target, err = d.backend(st.Desired); err != nil {
			return err
		}
		if err := target.Provision(ctx, st.To); err != nil {
			return err
		}
		return target.Configure(ctx, st.To)
	case Switch:
		if st.SwitchAt.IsZero() {
			st.SwitchAt = d.now().UTC()
			if err := saveState(d.Root, st); err != nil {
				return err
			}
		}
		old, err := d.oldBackend(st)
		if err != nil {
			return err
		}
		return old.Stop(ctx, st.From)
	case Start:
		// After a power cut the old node may run again (its machine is
		// enabled at boot until commit): stopping it is a no-op otherwise,
		// and two nodes must never share the kubelet's ports.
		old, err := d.oldBackend(st)
		if err != nil {
			return err
		}
		if err := old.Stop(ctx, st.From); err != nil {
			return err
		}
		return target.Start(ctx, st.To)
	case Verify:
		if err := d.waitNode(ctx, target, st.Desired, st.To); err != nil {
			return err
		}
		return d.checkVersion(ctx, target, st.Desired, st.To)
	case Commit:
		// What kubeslot labelled the Node with so far: the old slot's
		// applied configuration, there until clean.
		var prev map[string]string
		if old, err := d.Store.LoadApplied(st.From); err == nil {
			prev = old.Config.Kubernetes.Labels
		} else if !errors.Is(err, state.ErrNotFound) {
			return err
		}
		a, err := isolation.NewApplied(st.To, st.Desired, d.AgentVersion, d.now())
		if err != nil {
			return err
		}
		if err := d.Store.SaveApplied(a); err != nil {
			return err
		}
		if err := d.Store.SetActive(st.To); err != nil {
			return err
		}
		if err := d.Boot.Move(ctx, st.From, st.To); err != nil {
			return err
		}
		st.Warning = d.syncLabels(ctx, st.Desired, prev)
		return nil
	case Clean:
		old, err := d.oldBackend(st)
		if err != nil {
			return err
		}
		if err := old.Remove(ctx, st.From); err != nil {
			return err
		}
		if err := d.Store.RemoveApplied(st.From); err != nil {
			return err
		}
		d.pruneCache()
		return nil
	case Rollback:
		if _, err := d.backToOld(ctx, st, target); err != nil {
			return err
		}
		return d.uncommit(ctx, st)
	case RollbackVerify:
		return d.rollbackVerify(ctx, st, target)
	}
	return fmt.Errorf("repave state: unknown phase %q", st.Phase)
}

// backToOld stops the target slot's node and starts the old slot's again
// (both idempotent), and returns the old slot's backend.
func (d *Deps) backToOld(ctx context.Context, st *State, target isolation.Backend) (isolation.Backend, error) {
	if err := target.Stop(ctx, st.To); err != nil {
		return nil, fmt.Errorf("stop the target slot %s: %w", st.To, err)
	}
	old, err := d.oldBackend(st)
	if err != nil {
		return nil, err
	}
	if err := old.Start(ctx, st.From); err != nil {
		return nil, fmt.Errorf("start the old slot %s again: %w", st.From, err)
	}
	return old, nil
}

// uncommit takes back what an interrupted commit of the target did before a
// resumed verify failed: the old slot is active and starts at boot again.
func (d *Deps) uncommit(ctx context.Context, st *State) error {
	// Commit saves the target's configuration, sets it active, then moves
	// the boot link: active names the target once the last two may have
	// happened.
	if cur, found, err := d.Store.Active(); err != nil {
		return err
	} else if found && cur == st.To {
		if err := d.Store.SetActive(st.From); err != nil {
			return err
		}
		if err := d.Boot.Move(ctx, st.To, st.From); err != nil {
			return err
		}
	}
	return d.Store.RemoveApplied(st.To)
}

// rollbackVerify waits for the old slot's node, Ready as posted by the
// kubelet that runs there now, and removes the failed target. Starting the
// old slot is idempotent, and needed when a reboot came after rollback: the
// target may then run (as a stop in rollback left it) or not.
func (d *Deps) rollbackVerify(ctx context.Context, st *State, target isolation.Backend) error {
	old, err := d.backToOld(ctx, st, target)
	if err != nil {
		return err
	}
	a, err := d.Store.LoadApplied(st.From)
	if err != nil {
		return err
	}
	if err := d.waitNode(ctx, old, a.Config, st.From); err != nil {
		return fmt.Errorf("old slot %s after rollback: %w", st.From, err)
	}
	// The failed target is removed; the next repave prepares it afresh.
	if err := target.Remove(ctx, st.To); err != nil {
		d.Log.Warn("could not remove the failed target slot", "slot", st.To, "err", err)
	}
	return nil
}

// Restart restarts the active slot's node in place through its mode's
// operator, waits for kubelet health and Node Ready, and writes the status
// of request id.
func Restart(ctx context.Context, d *Deps, id, op string, gen int64) (*requests.Status, error) {
	a, err := d.Store.ActiveApplied()
	if err != nil {
		return nil, err
	}
	if a == nil {
		return nil, exitcode.Defer(errors.New("restart: no slot committed yet (the bootstrap has not finished)"))
	}
	m, err := isolation.AppliedMode(a)
	if err != nil {
		return nil, err
	}
	b, o, err := d.Isolation(m, a.Config)
	if err != nil {
		return nil, err
	}
	st := &requests.Status{RequestID: id, Kind: requests.Restart, Operation: op, MachineGeneration: gen,
		Phase: requests.InProgress, Message: "restarting the node on slot " + a.Slot}
	if err := d.Requests.WriteStatus(st); err != nil {
		d.Log.Warn("could not write progress", "err", err)
	}
	if d.Hook != nil {
		if err := d.Hook(ctx, RestartNode); err != nil {
			return nil, err
		}
	}
	t0 := d.now()
	err = o.RestartNode(ctx, a.Slot)
	st.Phases = append(st.Phases, requests.PhaseTiming{Name: "restart", StartedAt: t0.UTC(), Duration: d.now().Sub(t0)})
	if err == nil {
		t1 := d.now()
		err = d.waitNode(ctx, b, a.Config, a.Slot)
		st.Phases = append(st.Phases, requests.PhaseTiming{Name: string(Verify), StartedAt: t1.UTC(), Duration: d.now().Sub(t1)})
	}
	st.ActiveSlot = a.Slot
	if err != nil {
		st.Phase, st.Message = requests.Failed, "restart of the node on slot "+a.Slot+" failed: "+err.Error()
	} else {
		st.Phase, st.Message, st.Downtime = requests.Succeeded, "node on slot "+a.Slot+" restarted", d.now().Sub(t0)
		// The labels of the applied configuration, in case an earlier
		// update did not reach the Node; nothing to remove.
		if w := d.syncLabels(ctx, a.Config, nil); w != "" {
			st.Message += "; " + w
		}
	}
	if werr := d.Requests.WriteStatus(st); werr != nil {
		err = errors.Join(err, fmt.Errorf("write status: %w", werr))
	}
	return st, err
}

// pruneCache removes from the artifact cache what no slot's applied
// configuration, no pending or claimed repave or upgrade and no repave in
// progress needs, and what killed downloads left (lib/cachekeep; issue 16,
// item 11). Under the lock; a failure is only logged: the cache is
// kubeslot's own, and the next run tries again.
func (d *Deps) pruneCache() {
	if err := cachekeep.Prune(d.Root, d.Log); err != nil {
		d.Log.Warn("artifact cache not pruned", "err", err.Error())
	}
}
