package bootstrap

import (
	"context"
	"log/slog"

	"github.com/kubeslot/kubeslot/lib/buildinfo"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/slot"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/transition"
)

// runner carries one install run through its phases.
type runner struct {
	d       Deps
	cfg     *config.Config
	rec     *ownership.Record
	log     *slog.Logger
	backend isolation.Backend
	op      isolation.Operator
}

// slot is the slot a bootstrap installs: the first configured one.
func (r *runner) slot() string { return r.cfg.Isolation.Slots[0] }

// checkingVersions names the table's check (transition.Phase.Check): no
// checkpoint of its own, run by every run with phases left.
const checkingVersions = "checking-versions"

// list is the table of phases, in order; each is named by the checkpoint
// the record holds while it runs, but the first, a check. complete is not
// a phase: it is written after the last one (phases).
func (r *runner) list() []transition.Phase {
	return []transition.Phase{
		r.check(checkingVersions, ownership.CheckpointPreparingSlot, "check the version skew, pin the kubelet of the version", r.checkVersions),
		r.phase(ownership.CheckpointPreparingHost, "prepare the host (lib/hostprep)", r.prepareHost),
		r.phase(ownership.CheckpointPreparingSlot, "provision and configure the slot", r.prepareSlot),
		r.phase(ownership.CheckpointStartingNode, "start the node, wait for it to be Ready, enable its machine at boot", r.startNode),
		r.phase(ownership.CheckpointInstallingUnits, "install the release and the unit files, then commit the applied configuration", r.installUnits),
	}
}

// phase is one row of the table: a failure is reported on the Machine as
// <Phase>Failed, naming the phase.
func (r *runner) phase(cp ownership.Checkpoint, what string, run func(context.Context) error) transition.Phase {
	return transition.Phase{Name: string(cp), What: what, Run: run,
		OnFailure: func(ctx context.Context, err error) {
			r.d.Cluster.Report(ctx, r.cfg, Report{Phase: cp, State: Failed, Err: &transition.PhaseError{Phase: string(cp), Err: err}})
		}}
}

// check is a check of the table (no checkpoint): a failure is reported as
// the failure of the phase cp, whose work it is the first part of.
func (r *runner) check(name string, cp ownership.Checkpoint, what string, run func(context.Context) error) transition.Phase {
	p := r.phase(cp, what, run).AsCheck()
	p.Name = name
	return p
}

// PhaseNames are the names of the phases in order (the checkpoints before
// complete), from the table the run uses.
func PhaseNames() []string {
	var out []string
	for _, p := range (&runner{}).list() {
		if p.Check {
			continue
		}
		out = append(out, p.Name)
	}
	return out
}

// phases runs every phase from the record's checkpoint on, through the
// stage runner (lib/transition). The checkpoint of a phase is written (and
// reported Running) before it starts, so a crash resumes that phase (each is
// idempotent); complete is written only after the commit.
func (r *runner) phases(ctx context.Context, res *Result) error {
	tr := transition.Runner{Stage: "bootstrap", Log: r.log,
		Skip: func(name string) bool { return r.rec.Checkpoint.Passed(ownership.Checkpoint(name)) },
		Save: func(ctx context.Context, p transition.Phase) error {
			cp := ownership.Checkpoint(p.Name)
			if err := r.checkpoint(cp); err != nil {
				return err
			}
			r.d.status("%s: %s", cp, p.What)
			r.d.Cluster.Report(ctx, r.cfg, Report{Phase: cp, State: Running})
			return nil
		},
		Pause: func(ctx context.Context, name string) error { return r.pause(ctx, ownership.Checkpoint(name)) },
	}
	timings, err := tr.Run(ctx, r.list())
	for _, t := range timings {
		res.Phases = append(res.Phases, ownership.Checkpoint(t.Name))
	}
	if err != nil {
		r.d.status("failed: %s", err)
		return err
	}
	if err := r.pause(ctx, ownership.CheckpointComplete); err != nil {
		return err
	}
	if err := r.checkpoint(ownership.CheckpointComplete); err != nil {
		return err
	}
	r.log.Info("bootstrap complete", "slot", r.slot())
	r.d.Cluster.Report(ctx, r.cfg, Report{Phase: ownership.CheckpointComplete, State: Succeeded, Slot: r.slot()})
	return nil
}

func (r *runner) checkpoint(cp ownership.Checkpoint) error {
	if r.rec.Checkpoint == cp {
		return nil
	}
	if err := r.rec.SetCheckpoint(cp); err != nil {
		return err
	}
	return ownership.Save(r.d.Root, r.rec)
}

// pause is the KUBESLOT_TEST_PAUSE_AT hook (the runner's Pause, and before
// complete is written).
func (r *runner) pause(ctx context.Context, cp ownership.Checkpoint) error {
	if r.d.Pause == nil {
		return nil
	}
	return r.d.Pause(ctx, string(cp))
}

// isolation builds the backend and operator once per run.
func (r *runner) isolation() (isolation.Backend, error) {
	if r.backend == nil {
		b, o, err := r.d.NewIsolation(r.cfg, r.rec)
		if err != nil {
			return nil, err
		}
		r.backend, r.op = b, o
	}
	return r.backend, nil
}

// checkVersions refuses a version the skew policy forbids before anything
// is downloaded (until the slot is prepared; best effort: a cluster that
// cannot be asked yet is waited for later, by the Node Ready wait), then
// pins the kubelet of the version on the release mirror, on every run:
// the slot is built from it and the applied configuration records it, and
// the pin lives in memory.
func (r *runner) checkVersions(ctx context.Context) error {
	if !r.rec.Checkpoint.Passed(ownership.CheckpointPreparingSlot) {
		server, known, err := checkSkew(ctx, &r.d, r.cfg)
		if err != nil {
			return err
		}
		if known {
			r.log.Info("kubernetes version within the skew policy", "version", r.cfg.Kubernetes.Version, "apiserver", server)
		} else {
			r.log.Warn("version skew not checked: the API server's version is unknown", "reason", server)
		}
	}
	return r.d.Releases.Pin(ctx, r.cfg)
}

func (r *runner) prepareHost(ctx context.Context) error {
	return r.d.Host.Apply(ctx, r.cfg, r.rec)
}

func (r *runner) prepareSlot(ctx context.Context) error {
	b, err := r.isolation()
	if err != nil {
		return err
	}
	return slot.Prepare(ctx, b, r.slot())
}

// startNode boots the node, waits for its kubelet's health and the Node
// Ready (together bounded by timeouts.node_ready), checks the release the
// slot's binary and the Node report (a mirror serving another release's
// binary under the version's path is caught here), and enables the node's
// machine unit at boot.
func (r *runner) startNode(ctx context.Context) error {
	b, err := r.isolation()
	if err != nil {
		return err
	}
	name, t := r.slot(), r.d.tasks()
	if err := b.Start(ctx, name); err != nil {
		return err
	}
	if _, err := t.WaitReady(ctx, b, r.cfg, name); err != nil {
		return err
	}
	if err := slot.CheckBinary(ctx, b, r.cfg, name); err != nil {
		return err
	}
	if err := t.CheckNode(ctx, r.cfg); err != nil {
		return err
	}
	changed, err := r.bootLinks(isolation.Mode(r.cfg.Isolation.Mode)).Enable(name)
	if err != nil {
		return err
	}
	if changed {
		return r.d.Systemd.Reload(ctx)
	}
	return nil
}

// bootLinks are the links that start a slot's node of mode at host boot.
func (r *runner) bootLinks(mode isolation.Mode) *slot.BootLinks {
	return &slot.BootLinks{Root: r.d.Root, Record: r.rec, Log: r.log, Mode: mode}
}

// installUnits installs the release (current, and last-good on it when
// there is none) and the unit files, then commits: the
// applied configuration of the slot and applied/active, only now that the
// node passed verification.
func (r *runner) installUnits(ctx context.Context) error {
	if err := r.d.Releaser.Ensure(ctx); err != nil {
		return err
	}
	if err := ensureLastGood(r.d.Root, r.log); err != nil {
		return err
	}
	changed, err := installUnits(r.d.Root, r.rec)
	if err != nil {
		return err
	}
	if len(changed) > 0 {
		r.log.Info("unit files installed", "changed", changed)
	}
	if err := r.d.Systemd.Reload(ctx); err != nil {
		return err
	}
	// The node is Ready and its identity on disk: the join token goes
	// before the applied configuration is committed without it.
	if _, err := dropJoinToken(r.d, r.cfg, r.slot(), r.log); err != nil {
		return err
	}
	return slot.Commit(state.NewStore(r.d.Root), r.slot(), r.cfg, buildinfo.Version, r.d.now())
}
