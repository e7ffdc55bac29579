package repave

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/kubeslot/kubeslot/lib/cachekeep"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/drain"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/slot"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/transition"
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
		MachineGeneration: st.MachineGeneration, Phase: phase, Message: msg, Phases: st.Phases, Drain: st.Drain}
}

// Run drives the transition st from its recorded phase to the end and
// writes the final status. It returns that status and, when the repave
// failed, an error (wrapping ErrRolledBack after a rollback). An error from
// the Pause hook, a stop (SIGTERM), or a failure in commit, clean or
// rollback, leaves the state file for a resume.
func Run(ctx context.Context, d *Deps, st *State) (*requests.Status, error) {
	defer d.background.Wait()
	log := d.Log.With("request", st.RequestID, "from", st.From, "to", st.To)
	tr := transition.Runner{Stage: "repave", Log: log, From: string(st.Phase), StopOnCancel: true, Now: d.Now,
		Pause: d.Pause,
		Save: func(_ context.Context, p transition.Phase) error {
			st.Phase = Phase(p.Name)
			if err := saveState(d.Root, st); err != nil {
				return err
			}
			if err := d.Requests.WriteStatus(d.status(st, requests.InProgress, "repave "+st.From+" -> "+st.To+": "+p.Name)); err != nil {
				log.Warn("could not write progress", "err", err)
			}
			return nil
		},
		// Failed phases are timed too: the status shows how long a failed
		// verify waited.
		Timed: func(t requests.PhaseTiming, _ error) { st.Phases = append(st.Phases, t) },
	}
	_, err := tr.Run(ctx, d.table(st, log))
	pe, _ := errors.AsType[*transition.PhaseError](err)
	switch {
	case err == nil && st.Phase == RollbackVerify:
		msg := fmt.Sprintf("repave to slot %s failed in %s: %s; rolled back to slot %s, its node is Ready", st.To, st.FailedIn, st.Reason, st.From)
		if st.Warning != "" {
			msg += "; " + st.Warning
		}
		var down time.Duration
		if !st.SwitchAt.IsZero() { // the old node was stopped: down until it was Ready again
			down = d.now().Sub(st.SwitchAt)
		}
		return d.finish(st, requests.Failed, msg, st.From, down, fmt.Errorf("%w: %s", ErrRolledBack, msg))
	case err == nil:
		var down time.Duration
		if !st.ReadyAt.IsZero() {
			down = st.ReadyAt.Sub(st.SwitchAt)
		}
		msg := fmt.Sprintf("repaved from slot %s to slot %s", st.From, st.To)
		st.Warning = joinWarning(st.Warning, d.lostAfterSwitch(st.RequestID))
		if st.Warning != "" {
			msg += "; " + st.Warning
		}
		return d.finish(st, requests.Succeeded, msg, st.To, down, nil)
	case pe != nil && pe.Stopped && ctx.Err() != nil:
		// Stopped (SIGTERM: a shutdown, systemctl stop), not failed: no
		// rollback and no final status. The state file keeps the phase,
		// and the next start resumes it.
		return nil, fmt.Errorf("repave %s -> %s stopped in %s (%v); the next start resumes it", st.From, st.To, st.Phase, context.Cause(ctx))
	case pe == nil || !pe.Ran:
		// The state not saved, or the test hook: as a crash.
		return nil, errors.Unwrap(err)
	case st.Phase == Prepare:
		// The old node was never touched: nothing to roll back.
		msg := fmt.Sprintf("repave to slot %s failed in prepare (the node on slot %s kept running): %v", st.To, st.From, pe.Err)
		return d.finish(st, requests.Failed, msg, st.From, 0, errors.New(msg))
	default:
		// commit, clean, rollback: the state stays; a re-run retries.
		msg := fmt.Sprintf("repave %s -> %s: %s: %v (a re-run resumes it)", st.From, st.To, st.Phase, pe.Err)
		if werr := d.Requests.WriteStatus(d.status(st, requests.InProgress, msg)); werr != nil {
			log.Warn("could not write progress", "err", werr)
		}
		return nil, errors.New(msg)
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

// lostAfterSwitch is the warning of a request that finished without the
// rollout slot it was started under ("" when it kept it): lost past the
// point of no return, so it went on, and the rollout may have had one more
// target disrupted than its maxUnavailable.
func (d *Deps) lostAfterSwitch(id string) string {
	if err := d.Requests.CheckSlot(id); err != nil {
		return "its rollout slot was lost after the point of no return, so it finished; another target may have been disrupted at the same time (" + err.Error() + ")"
	}
	return ""
}

// table is the repave's phases: the forward chain to clean, then the
// rollback that a failure in switch, start or verify goes to. Each run gets
// the backend of the target's mode.
func (d *Deps) table(st *State, log *slog.Logger) []transition.Phase {
	rollBack := func(_ context.Context, err error) {
		log.Error("repave failed; rolling back", "phase", st.Phase, "err", err)
		st.FailedIn, st.Reason = st.Phase, err.Error()
	}
	ph := func(p Phase, what string, run func(context.Context, *State, isolation.Backend) error) transition.Phase {
		return transition.Phase{Name: string(p), What: what, Run: func(ctx context.Context) error {
			target, err := d.backend(st.Desired)
			if err != nil {
				return err
			}
			return run(ctx, st, target)
		}}
	}
	return []transition.Phase{
		ph(Prepare, "provision and configure the target slot", d.prepare),
		ph(Standby, "boot the target's machine warm", d.standby).FailingTo(string(Rollback), rollBack),
		ph(Drain, "cordon the node, evict its pods", d.drainOld).FailingTo(string(Rollback), rollBack),
		ph(Switch, "stop the old node", d.switchOld).FailingTo(string(Rollback), rollBack),
		ph(Start, "start the target's node", d.start).FailingTo(string(Rollback), rollBack),
		ph(Verify, "wait for the target's node", d.verify).FailingTo(string(Rollback), rollBack),
		ph(Commit, "commit the target slot", d.commit),
		ph(Uncordon, "make the node schedulable again", d.uncordon),
		ph(Clean, "remove the old slot", d.clean).Final(),
		ph(Rollback, "stop the target, start the old slot", d.rollback),
		ph(RollbackVerify, "wait for the old slot's node, remove the target", d.rollbackVerify),
	}
}

// PhaseChains are the chains of the repave's table (transition.Chains),
// for DESIGN.md's diagram.
func PhaseChains() [][]string {
	return transition.Chains((&Deps{}).table(&State{}, nil))
}

// prepare is refused by the version skew policy before anything is
// fetched; then it pins the kubelet the version names in the state, so
// that a resume installs the same file, and provisions and configures the
// target (built after the pin, from the pinned configuration).
func (d *Deps) prepare(ctx context.Context, st *State, _ isolation.Backend) error {
	if err := d.checkSkew(ctx, st); err != nil {
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
	target, err := d.backend(st.Desired)
	if err != nil {
		return err
	}
	return slot.Prepare(ctx, target, st.To)
}

// standby boots the target's machine while the old node still serves:
// containerd and the kubelet are held back by their condition
// (nodeconfig.ServingFile), so that the downtime that starts at switch is a
// kubelet stop and a kubelet start, not a machine boot. The target is not
// enabled at host boot: a power cut from here to commit boots the old slot
// alone, and the resume boots the target again (or start does, cold).
// The kubelet binary's release is checked here, on the warm machine: a
// wrong one fails before the old node is touched.
func (d *Deps) standby(ctx context.Context, st *State, target isolation.Backend) error {
	if err := target.Boot(ctx, st.To); err != nil {
		return err
	}
	return slot.CheckBinary(ctx, target, st.Desired, st.To)
}

// switchOld hands the container runtime over to the warm target while the
// old kubelet still serves (handRuntime), then stops the old node whole; the
// downtime starts there, once. The old machine goes before the target's
// kubelet starts: the old pods' processes, network namespaces and addresses
// go with it.
func (d *Deps) switchOld(ctx context.Context, st *State, target isolation.Backend) error {
	old, err := d.oldBackend(st)
	if err != nil {
		return err
	}
	if st.SwitchAt.IsZero() {
		// The point of no return: a slot lost since the drain stops here.
		if err := d.Requests.CheckSlot(st.RequestID); err != nil {
			return err
		}
		d.handRuntime(ctx, st, old, target)
		st.SwitchAt = d.now().UTC()
		if err := saveState(d.Root, st); err != nil {
			return err
		}
	}
	return old.Stop(ctx, st.From)
}

// handRuntime stops the old node's containerd and starts the warm target's
// (isolation.RuntimeHandover), so that neither is inside the downtime: both
// slots share containerd's state, so the two cannot run at once, but the
// old kubelet keeps serving without its runtime for that moment (its pods
// keep running; it starts or stops no container). Only a target whose
// machine runs (the standby booted it) takes it: one booted now would start
// its kubelet beside the old one. A failure is a warning: the old node's
// Stop and the target's Start that follow do what is left, as before.
func (d *Deps) handRuntime(ctx context.Context, st *State, old, target isolation.Backend) {
	from, okFrom := old.(isolation.RuntimeHandover)
	to, okTo := target.(isolation.RuntimeHandover)
	if !okFrom || !okTo || !to.Warm(ctx, st.To) {
		return
	}
	t0 := time.Now()
	if err := from.StopRuntime(ctx, st.From); err != nil {
		d.Log.Warn("could not stop the old node's container runtime before its kubelet; stopping the node whole", "slot", st.From, "err", err)
		return
	}
	if err := to.StartRuntime(ctx, st.To); err != nil {
		d.Log.Warn("could not start the target's container runtime before the old kubelet stops; the target's start tries again", "slot", st.To, "err", err)
		return
	}
	d.Log.Info("container runtime handed over", "from", st.From, "to", st.To, "took", time.Since(t0).Round(time.Millisecond))
}

// start starts the target. After a power cut the old node may run again
// (its machine is enabled at boot until commit): stopping it is a no-op
// otherwise, and two nodes must never share the kubelet's ports.
func (d *Deps) start(ctx context.Context, st *State, target isolation.Backend) error {
	old, err := d.oldBackend(st)
	if err != nil {
		return err
	}
	if err := old.Stop(ctx, st.From); err != nil {
		return err
	}
	return target.Start(ctx, st.To)
}

// verify waits for the target's node; the downtime ends when it is Ready
// (ReadyAt), before the release its Node reports is checked.
func (d *Deps) verify(ctx context.Context, st *State, target isolation.Backend) error {
	if err := d.waitNode(ctx, target, st.Desired, st.To); err != nil {
		return err
	}
	st.ReadyAt = d.now().UTC()
	return d.tasks().CheckNode(ctx, st.Desired)
}

func (d *Deps) commit(ctx context.Context, st *State, _ isolation.Backend) error {
	// What kubeslot labelled the Node with so far: the old slot's applied
	// configuration, there until clean.
	var prev map[string]string
	if old, err := d.Store.LoadApplied(st.From); err == nil {
		prev = old.Config.Kubernetes.Labels
	} else if !errors.Is(err, state.ErrNotFound) {
		return err
	}
	if err := slot.Commit(d.Store, st.To, st.Desired, d.AgentVersion, d.now()); err != nil {
		return err
	}
	if err := d.Boot.Move(ctx, st.From, st.To); err != nil {
		return err
	}
	if w := d.syncLabels(ctx, st.Desired, prev); w != "" {
		st.Warning = joinWarning(st.Warning, w)
	}
	return nil
}

func (d *Deps) clean(ctx context.Context, st *State, _ isolation.Backend) error {
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
}

func (d *Deps) rollback(ctx context.Context, st *State, target isolation.Backend) error {
	if _, err := d.backToOld(ctx, st, target); err != nil {
		return err
	}
	return d.uncommit(ctx, st)
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
	// Healthy again: the drain's cordon is taken back.
	d.uncordonNode(ctx, st, a.Config)
	// The failed target is removed; the next repave prepares it afresh.
	if err := target.Remove(ctx, st.To); err != nil {
		d.Log.Warn("could not remove the failed target slot", "slot", st.To, "err", err)
	}
	return nil
}

// Restart restarts the active slot's node in place through its mode's
// operator, after draining it with policy (nil: the defaults; skipDrain: not
// at all), waits for kubelet health and Node Ready, uncordons the node, and
// writes the status of request id. A restart has no state file: a run killed
// after its claim runs again from the drain, whose cordon is idempotent.
func Restart(ctx context.Context, d *Deps, id, op string, gen int64, policy *drain.Policy, skipDrain bool) (*requests.Status, error) {
	defer d.background.Wait()
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
	// The drain's cordon and warnings, kept as a repave keeps them.
	rs := &State{RequestID: id, SkipDrain: skipDrain}
	// Three phases through the stage runner: the test hook pauses before
	// each; all are timed into the status, a failed one too.
	var t0 time.Time
	tr := transition.Runner{Stage: "restart", Log: d.Log, Pause: d.Pause, Now: d.now,
		Timed: func(t requests.PhaseTiming, _ error) { st.Phases = append(st.Phases, t) }}
	_, err = tr.Run(ctx, []transition.Phase{
		{Name: string(Drain), What: "cordon the node, evict its pods", Run: func(ctx context.Context) error {
			if err := d.Requests.CheckSlot(id); err != nil {
				return err
			}
			if skipDrain {
				return nil
			}
			pol, note := drainPolicy(policy, a.Config, false)
			if note != "" {
				d.Log.Warn(note)
			}
			dr, err := d.drainer(a.Config, func(p drain.Progress) {
				st.Drain, st.Message = &p, p.Message
				if err := d.Requests.WriteStatus(st); err != nil {
					d.Log.Warn("could not write progress", "err", err)
				}
			})
			if err != nil {
				return err
			}
			res, err := dr.Drain(ctx, pol, id)
			if err == nil && res.Forced {
				rs.Warning = res.Message
			}
			return err
		}},
		{Name: string(RestartNode), What: "restart the node (its services, or its machine)", Run: func(ctx context.Context) error {
			if err := d.Requests.CheckSlot(id); err != nil {
				return err // before t0: the node was not stopped
			}
			t0 = d.now()
			// The downtime starts when the node stopped serving, which a
			// restart that keeps the machine reports (after containerd's
			// restart, while the kubelet still served).
			down, err := o.RestartNode(ctx, a.Slot)
			if !down.IsZero() {
				t0 = down
			}
			return err
		}},
		{Name: string(Verify), What: "wait for the node", Run: func(ctx context.Context) error {
			return d.waitNode(ctx, b, a.Config, a.Slot)
		}},
	})
	var pe *transition.PhaseError
	if errors.As(err, &pe) && !pe.Ran {
		return nil, err // the test hook stopped it before a phase
	}
	st.ActiveSlot = a.Slot
	switch {
	case err != nil && t0.IsZero():
		// The drain failed: the node was never stopped, so it is healthy
		// and its cordon is taken back.
		d.uncordonNode(ctx, rs, a.Config)
		st.Phase, st.Message = requests.Failed, "restart of the node on slot "+a.Slot+" not done: the node kept running: "+err.Error()
	case err != nil:
		// Not healthy: the Node stays cordoned until a person looks.
		st.Phase, st.Message = requests.Failed, "restart of the node on slot "+a.Slot+" failed: "+err.Error()
	default:
		st.Phase, st.Message, st.Downtime = requests.Succeeded, "node on slot "+a.Slot+" restarted", d.now().Sub(t0)
		d.uncordonNode(ctx, rs, a.Config)
		// The labels of the applied configuration, in case an earlier
		// update did not reach the Node; nothing to remove.
		if w := d.syncLabels(ctx, a.Config, nil); w != "" {
			rs.Warning = joinWarning(rs.Warning, w)
		}
		rs.Warning = joinWarning(rs.Warning, d.lostAfterSwitch(id))
	}
	if rs.Warning != "" {
		st.Message += "; " + rs.Warning
	}
	if werr := d.Requests.WriteStatus(st); werr != nil {
		err = errors.Join(err, fmt.Errorf("write status: %w", werr))
	}
	return st, err
}

// pruneCache removes from the artifact cache what no slot's applied
// configuration, no pending or claimed repave or upgrade and no repave in
// progress needs, and what killed downloads left (lib/cachekeep). Under the lock; a failure is only logged: the cache is
// kubeslot's own, and the next run tries again.
func (d *Deps) pruneCache() {
	if err := cachekeep.Prune(d.Root, d.Log); err != nil {
		d.Log.Warn("artifact cache not pruned", "err", err.Error())
	}
}
