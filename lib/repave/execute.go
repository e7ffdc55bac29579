package repave

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/drain"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/state"
)

// Job is what the repaver was started for.
type Job struct {
	// Kind is requests.Repave or requests.Restart.
	Kind requests.Kind
	// Slot is the repave target: a slot name, or "next" (the one that is
	// not active).
	Slot string
	// Config, when set, is the desired configuration of a repave started
	// by hand (--config); otherwise a manual repave rebuilds the active
	// applied configuration onto the target slot.
	Config *config.Config
	// Triggered: started by a path unit for a request (systemd sets
	// TRIGGER_PATH). With no request left to claim (another run took it)
	// there is nothing to do, rather than a repave by hand.
	Triggered bool
	// SkipDrain: a repave or restart by hand that does not drain the node
	// (--no-drain). A request is always drained, with its policy.
	SkipDrain bool
}

// NextSlot is the Slot that names the slot that is not active.
const NextSlot = "next"

// Execute does one job while the caller holds lock: it resumes an
// interrupted repave first (its state file wins over anything new), else it
// claims the pending request of the job's kind (by rename, under the lock),
// else it runs the job by hand. A claimed request is finished (removed)
// after its final status is written, also when it failed validation, so a
// bad request does not loop. A request whose ID already has a final status
// is finished without running again.
func Execute(ctx context.Context, d *Deps, lock *ownership.Lock, j Job) (*requests.Status, error) {
	// First, under the lock: what killed downloads left, and artifacts that
	// nothing uses any more (a rolled-back target's, a finished upgrade's
	// bundle). A repave in progress keeps its own (lib/cachekeep).
	d.pruneCache()
	if done, s, err := resume(ctx, d, lock, j); done {
		return s, err
	}
	active, err := d.Store.ActiveApplied()
	if err != nil {
		return nil, err
	}
	if active == nil {
		return nil, exitcode.Defer(errors.New("no slot committed yet: the bootstrap has not finished"))
	}
	req, refused, err := claim(d, lock, j.Kind)
	if err != nil {
		return nil, err
	}
	if req == nil && j.Triggered {
		if len(refused) > 0 {
			d.Log.Info("nothing run: the request was refused and moved aside", "kind", j.Kind, "file", refused[0].File, "moved_to", refused[0].MovedTo)
			return nil, nil
		}
		d.Log.Info("no request to claim: another run took it", "kind", j.Kind)
		return nil, nil
	}
	id, op, gen := requests.NewID(j.Kind, 0, "manual-"+strconv.FormatInt(d.now().Unix(), 10)), "", int64(0)
	var policy *drain.Policy
	skip := j.SkipDrain
	if req != nil {
		id, op, gen, policy, skip = req.ID, req.Operation, req.MachineGeneration, req.Disruption, false
		// The same request written twice (a writer that retried after its
		// first write was taken): it ran once, its status says how.
		if prev, err := d.Requests.ReadStatus(id); err == nil && prev.Phase.Finished() {
			d.Log.Info("request already done: not run again", "request", id, "kind", j.Kind, "result", prev.Phase)
			finishClaim(d, lock, j.Kind, id)
			return prev, nil
		}
		d.Log.Info("claimed request", "request", id, "kind", j.Kind, "reason", req.Reason)
	}
	var s *requests.Status
	switch j.Kind {
	case requests.Restart:
		if req != nil && req.Desired != nil {
			// A spec change the watcher chose to apply in place.
			s, err = Patch(ctx, d, req, active)
			break
		}
		s, err = Restart(ctx, d, id, op, gen, policy, skip)
	case requests.Repave:
		s, err = repave(ctx, d, j, req, active, id, op, gen, policy, skip)
	default:
		return nil, exitcode.UsageError(fmt.Errorf("job kind %q: the repaver does repave and restart", j.Kind))
	}
	if req != nil && s != nil {
		finishClaim(d, lock, j.Kind, id)
	}
	return s, err
}

// resume runs an interrupted repave (its state file wins over anything
// new); done says the job is done with it.
func resume(ctx context.Context, d *Deps, lock *ownership.Lock, j Job) (bool, *requests.Status, error) {
	st, err := LoadState(d.Root)
	if err != nil || st == nil {
		return err != nil, nil, err
	}
	d.Log.Info("resuming an interrupted repave", "request", st.RequestID, "phase", st.Phase, "from", st.From, "to", st.To)
	if st.Phase == Verify || st.Phase == Commit {
		// The host may have rebooted since, with the old node booted (its
		// boot link moves only at the end of commit) and the target not
		// running: start and verify again whatever is to be committed,
		// which is idempotent for a target that still runs (a commit resumed
		// after a power cut must not name a slot whose node is not running).
		st.Phase = Start
	}
	s, err := Run(ctx, d, st)
	if s != nil {
		finishClaim(d, lock, requests.Repave, st.RequestID)
	}
	// A restart asked for while a repave was interrupted: do it now.
	return j.Kind == requests.Repave || err != nil, s, err
}

// claim moves unusable request files of kind aside, each logged with why
// ("nothing to claim" must not be all a person reads after asking), then
// claims the pending request (nil: none).
func claim(d *Deps, lock *ownership.Lock, kind requests.Kind) (*requests.Request, []requests.Refused, error) {
	refused, err := d.Requests.SweepRefused(lock, kind)
	logRefused(d.Log, refused)
	if err != nil {
		return nil, refused, err
	}
	req, err := d.Requests.Claim(lock, kind)
	if late := requests.AsRefused(err); len(late) > 0 {
		logRefused(d.Log, late)
		refused = append(refused, late...)
	}
	if errors.Is(err, requests.ErrNoRequest) {
		return nil, refused, nil
	}
	return req, refused, err
}

// repave starts the repave of request id (req, nil for one by hand) from
// the active slot; a request that does not validate is Failed.
func repave(ctx context.Context, d *Deps, j Job, req *requests.Request, active *state.Applied, id, op string, gen int64, policy *drain.Policy, skip bool) (*requests.Status, error) {
	desired := active.Config
	switch {
	case req != nil:
		desired = req.Desired
	case j.Config != nil:
		desired = j.Config
	}
	to, err := target(j.Slot, active.Slot, desired)
	if err == nil {
		err = desired.Validate()
	}
	if err != nil {
		if req == nil {
			return nil, exitcode.UsageError(err)
		}
		s := &requests.Status{RequestID: id, Kind: requests.Repave, Operation: op, MachineGeneration: gen,
			Phase: requests.Failed, Message: "repave request refused: " + err.Error(), ActiveSlot: active.Slot}
		if werr := d.Requests.WriteStatus(s); werr != nil {
			return nil, errors.Join(err, werr)
		}
		return s, err
	}
	st := NewState(d, id, op, gen, active.Slot, to, desired)
	st.Disruption, st.SkipDrain = policy, skip
	return Run(ctx, d, st)
}

// target resolves the job's slot against the active one.
func target(slot, active string, cfg *config.Config) (string, error) {
	slots := cfg.Isolation.Slots
	if len(slots) == 0 {
		slots = config.DefaultSlots()
	}
	if !slices.Contains(slots, active) {
		return "", fmt.Errorf("desired configuration: isolation.slots %v does not include the active slot %q", slots, active)
	}
	if slot == "" || slot == NextSlot {
		for _, s := range slots {
			if s != active {
				return s, nil
			}
		}
	}
	if !slices.Contains(slots, slot) {
		return "", fmt.Errorf("target slot %q: not one of %v or %q", slot, slots, NextSlot)
	}
	if slot == active {
		return "", fmt.Errorf("target slot %q is the active slot; a repave moves the node onto the other slot (%q)", slot, NextSlot)
	}
	return slot, nil
}

// finishClaim removes the claimed request of kind when it is the one with
// id (a claimed file of another request is left alone).
func finishClaim(d *Deps, lock *ownership.Lock, kind requests.Kind, id string) {
	c, err := d.Requests.Claimed(kind)
	if err != nil || c == nil || c.ID != id {
		return
	}
	if err := d.Requests.Finish(lock, kind); err != nil {
		d.Log.Warn("could not remove the claimed request", "kind", kind, "err", err)
	}
}

// logRefused logs each request file moved aside: which, where to, and why.
func logRefused(log *slog.Logger, refused []requests.Refused) {
	for _, r := range refused {
		log.Warn("request refused and moved aside", "kind", r.Kind, "file", r.File, "moved_to", r.MovedTo, "request", r.RequestID, "reason", r.Reason)
	}
}
