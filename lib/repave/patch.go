package repave

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kubeslot/kubeslot/lib/buildinfo"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/kuberelease"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/slot"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/transition"
)

// Patch applies req, a spec change the watcher chose to apply in place (a
// Kubernetes patch release, kuberelease.InPlace), to the active slot: the
// version checks and the kubelet pin (prepare), the new kubelet put into
// the running node and its release checked there before anything stops
// (patch-kubelet: a mirror serving the wrong binary costs no downtime), the
// node restarted in place
// (restart-node: containerd and the kubelet, the containers keep running),
// the same readiness and release checks as a repave's (verify), then the
// slot's applied configuration (commit). No drain: nothing leaves the
// node. A failure after the kubelet was touched patches the old one back
// and restarts again; the status says what was undone. Like a restart it
// has no state file: a killed run runs again from its claimed request,
// each phase idempotent, and one that finds the change committed only
// waits for the node.
func Patch(ctx context.Context, d *Deps, req *requests.Request, active *state.Applied) (*requests.Status, error) {
	defer d.background.Wait()
	desired, from := req.Desired, active.Config
	st := &requests.Status{RequestID: req.ID, Kind: requests.Restart, Operation: req.Operation, MachineGeneration: req.MachineGeneration,
		Phase: requests.InProgress, ActiveSlot: active.Slot,
		Message: fmt.Sprintf("patching kubernetes %s -> %s in place on slot %s (a patch release: no drain, containers keep running)",
			from.Kubernetes.Version, desired.Kubernetes.Version, active.Slot)}
	done := func(phase requests.Phase, msg string, err error) (*requests.Status, error) {
		st.Phase, st.Message = phase, msg
		if werr := d.Requests.WriteStatus(st); werr != nil {
			err = errors.Join(err, fmt.Errorf("write status: %w", werr))
		}
		return st, err
	}
	if err := desired.Validate(); err != nil {
		return done(requests.Failed, "patch request refused: "+err.Error(), err)
	}
	committed := desired.Fingerprint() == from.Fingerprint()
	if ok, why := kuberelease.InPlace(from, desired); !ok && !committed {
		err := errors.New("not a patch of what the node runs: " + why)
		return done(requests.Failed, "patch request refused, nothing changed: "+err.Error(), err)
	}
	mode, err := isolation.AppliedMode(active)
	if err != nil {
		return nil, err
	}
	b, o, kp, err := d.patcher(mode, desired)
	if errors.Is(err, errNoPatcher) {
		return done(requests.Failed, "patch request refused, nothing changed: "+err.Error()+" (spec.updateMethod Repave repaves instead)", err)
	}
	if err != nil {
		return nil, err
	}
	if err := d.Requests.WriteStatus(st); err != nil {
		d.Log.Warn("could not write progress", "err", err)
	}
	name := active.Slot
	var t0 time.Time
	touched, restarted := false, false
	tr := transition.Runner{Stage: "patch", Log: d.Log, Pause: d.Pause, Now: d.now,
		Timed: func(t requests.PhaseTiming, _ error) { st.Phases = append(st.Phases, t) }}
	table := []transition.Phase{
		{Name: string(Prepare), What: "check the version skew, pin the kubelet", Run: func(ctx context.Context) error {
			if committed {
				return nil
			}
			if _, _, err := d.tasks().Skew(ctx, desired, versionWait); err != nil {
				return err
			}
			return d.Releases.Pin(ctx, desired)
		}},
		{Name: string(PatchKubelet), What: "put the new kubelet into the running node", Run: func(ctx context.Context) error {
			if committed {
				return nil
			}
			touched = true
			if err := kp.PatchKubelet(ctx, name); err != nil {
				return err
			}
			return slot.CheckBinary(ctx, b, desired, name)
		}},
		{Name: string(RestartNode), What: "restart the node in place", Run: func(ctx context.Context) error {
			if committed {
				return nil
			}
			t0, restarted = d.now(), true
			down, err := o.RestartNode(ctx, name)
			if !down.IsZero() {
				t0 = down
			}
			return err
		}},
		{Name: string(Verify), What: "wait for the node, check the release it runs", Run: func(ctx context.Context) error {
			return d.verifyRelease(ctx, b, desired, name)
		}},
		{Name: string(Commit), What: "record the slot's new configuration", Run: func(ctx context.Context) error {
			if committed {
				return nil
			}
			return slot.Commit(d.Store, name, desired, buildinfo.Version, d.now())
		}},
	}
	_, err = tr.Run(ctx, table)
	if pe, ok := errors.AsType[*transition.PhaseError](err); ok && !pe.Ran {
		return nil, err // stopped before a phase (the test hook, a save)
	}
	switch {
	case err == nil && committed:
		return done(requests.Succeeded, fmt.Sprintf("slot %s runs this configuration already (kubernetes %s): nothing to change", name,
			desired.Kubernetes.Version), nil)
	case err == nil:
		if !t0.IsZero() {
			st.Downtime = d.now().Sub(t0)
		}
		return done(requests.Succeeded, fmt.Sprintf("kubelet patched in place on slot %s: kubernetes %s -> %s, containers kept running",
			name, from.Kubernetes.Version, desired.Kubernetes.Version), nil)
	case !touched:
		return done(requests.Failed, "patch not done, nothing changed: "+err.Error(), err)
	}
	if rerr := d.unpatch(ctx, mode, from, name, restarted); rerr != nil {
		return done(requests.Failed, fmt.Sprintf("patch to kubernetes %s failed: %v; putting %s back failed too: %v (the node needs a person)",
			desired.Kubernetes.Version, err, from.Kubernetes.Version, rerr), errors.Join(err, rerr))
	}
	return done(requests.Failed, fmt.Sprintf("patch to kubernetes %s failed: %v; rolled back: the node runs kubernetes %s again",
		desired.Kubernetes.Version, err, from.Kubernetes.Version), err)
}

// verifyRelease waits for the node (waitNode) and checks the release its
// kubelet binary and its Node report, as a repave's verify does.
func (d *Deps) verifyRelease(ctx context.Context, b isolation.Backend, cfg *config.Config, name string) error {
	if err := d.waitNode(ctx, b, cfg, name); err != nil {
		return err
	}
	if err := slot.CheckBinary(ctx, b, cfg, name); err != nil {
		return err
	}
	return d.tasks().CheckNode(ctx, cfg)
}

// unpatch puts the kubelet of from (the committed configuration) back into
// slot's node and, when the node was restarted onto the new one, restarts
// it again and waits for it.
func (d *Deps) unpatch(ctx context.Context, mode isolation.Mode, from *config.Config, name string, restarted bool) error {
	b, o, kp, err := d.patcher(mode, from)
	if err != nil {
		return err
	}
	d.Log.Warn("patch failed: putting the committed kubelet back", "slot", name, "version", from.Kubernetes.Version)
	if err := kp.PatchKubelet(ctx, name); err != nil {
		return err
	}
	if !restarted {
		return nil
	}
	if _, err := o.RestartNode(ctx, name); err != nil {
		return err
	}
	return d.verifyRelease(ctx, b, from, name)
}

// errNoPatcher is a mode whose backend cannot replace a kubelet in place.
var errNoPatcher = errors.New("cannot replace a kubelet in place")

// patcher is the backend and operator of mode for cfg, and the backend's
// in-place kubelet replacement (errNoPatcher, wrapped, when it has none).
func (d *Deps) patcher(mode isolation.Mode, cfg *config.Config) (isolation.Backend, isolation.Operator, isolation.KubeletPatcher, error) {
	b, o, err := d.Isolation(mode, cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	kp, ok := b.(isolation.KubeletPatcher)
	if !ok {
		return nil, nil, nil, fmt.Errorf("isolation mode %s %w", mode, errNoPatcher)
	}
	return b, o, kp, nil
}
