package nspawn

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
)

// Bounds of the steps that have no setting of their own.
const (
	// innerStopBound caps the bound (timeouts.stop) on stopping kubelet
	// and containerd inside the node before the machine itself is stopped.
	innerStopBound = 30 * time.Second
	// terminateBound bounds the machine's disappearance after
	// TerminateMachine (SIGKILL to all its processes).
	terminateBound = 15 * time.Second
	// stopMargin is added to timeouts.stop for our own wait on the stop
	// job: systemd itself gives up after TimeoutStopSec (the drop-in) and
	// kills the machine, and that should be what we see.
	stopMargin = 15 * time.Second
)

// machinePoll is how often the boot and stop waits look again: each of
// those waits is inside a node's downtime (a restart, a repave's switch),
// where a 200 ms poll cost 100 ms on average; a look is a D-Bus call to
// machined (and, booting, one nsenter).
const machinePoll = 50 * time.Millisecond

// gonePoll is waitGone's poll for its first goneFast: a halted node is gone
// in about 0.1 s, and a 50 ms poll found it 25 ms late on average, all of it
// in a switch's downtime. A look there is one D-Bus call, no process.
const (
	gonePoll = 10 * time.Millisecond
	goneFast = time.Second
)

func isNoMachine(err error) bool { return errors.Is(err, hostapi.ErrNoMachine) }

// Boot boots slot's node machine (systemd-nspawn@<slot>.service through
// systemd over D-Bus) and waits for the node's systemd to finish booting
// (bounded by timeouts.node_ready). A slot that does not serve yet (no
// nodeconfig.ServingFile in its rootfs) boots warm: containerd and the
// kubelet are skipped by their condition, so it can boot while the old
// slot's node still serves (the repave's standby). Boot on a running node
// only waits for it.
func (b *Backend) Boot(ctx context.Context, slot string) error { return b.bring(ctx, slot, false) }

// Start boots slot's node (Boot), marks the slot as serving and starts
// containerd and the kubelet inside. The mark and the rendered
// nodeconfig.NodeTargetDropIn make later boots start them by themselves.
// Start on a running node (a warm one too) only makes sure both are started.
func (b *Backend) Start(ctx context.Context, slot string) error { return b.bring(ctx, slot, true) }

// bring is Boot, and with serve Start, within timeouts.node_ready.
func (b *Backend) bring(ctx context.Context, slot string, serve bool) error {
	t0 := time.Now()
	ctx, cancel, err := b.bootBound(ctx, slot)
	if err != nil {
		return err
	}
	defer cancel()
	state, err := b.boot(ctx, slot, serve)
	if err != nil {
		return err
	}
	booted := time.Since(t0)
	if !serve {
		b.log.Info("node booted", "slot", slot, "state", state, "took", booted.Round(time.Millisecond))
		return nil
	}
	if err := b.markServing(slot); err != nil {
		return fmt.Errorf("start slot %s: %w", slot, err)
	}
	// Enabled by the rendered nodeconfig.NodeTargetDropIn: a start only.
	n := b.nodeSystemd(ctx, slot)
	err = n.StartUnits(ctx, nodeconfig.ContainerdUnit, nodeconfig.KubeletUnit)
	n.Close()
	if err != nil {
		return fmt.Errorf("start slot %s: start containerd and kubelet in the node: %w\n%s", slot, err, b.nodeJournal(ctx, slot))
	}
	b.log.Info("node started", "slot", slot, "state", state, "boot", booted.Round(time.Millisecond),
		"total", time.Since(t0).Round(time.Millisecond))
	return nil
}

// bootBound checks that slot can boot (configured, provisioned from this
// configuration) and bounds ctx by timeouts.node_ready.
func (b *Backend) bootBound(ctx context.Context, slot string) (context.Context, context.CancelFunc, error) {
	if err := b.checkSlot(slot); err != nil {
		return nil, nil, err
	}
	settings, err := b.localEntry(settingsPath(slot))
	if err != nil {
		return nil, nil, err
	}
	if _, err := os.Stat(settings); err != nil {
		return nil, nil, fmt.Errorf("start slot %s: %s: configure the slot first: %w", slot, settings, err)
	}
	if ok, err := b.Provisioned(slot); err != nil {
		return nil, nil, fmt.Errorf("start slot %s: %w", slot, err)
	} else if !ok {
		return nil, nil, fmt.Errorf("start slot %s: its rootfs was not provisioned from this configuration's artifacts: provision it first", slot)
	}
	bound := b.cfg.Timeouts.NodeReady.Duration
	ctx, cancel := context.WithTimeoutCause(ctx, bound, timeoutCause("starting the node of slot "+slot, bound, "timeouts.node_ready"))
	return ctx, cancel, nil
}

// boot starts the machine's unit and waits until the node has booted, within
// ctx (bootBound's); it returns the node systemd's state.
//
// With serve, a machine that runs already (a warm standby) is taken as
// booted on machined's word.
func (b *Backend) boot(ctx context.Context, slot string, serve bool) (string, error) {
	active, _, err := b.d.Systemd.UnitState(ctx, unitName(slot))
	if err != nil {
		return "", fmt.Errorf("start slot %s: %w", slot, err)
	}
	switch {
	case active == "deactivating":
		// A machine on its way down goes first: a start job would replace
		// the stop job while its shutdown goes on.
		if err := b.Stop(ctx, slot); err != nil {
			return "", fmt.Errorf("start slot %s: wait for its stop: %w", slot, err)
		}
	case active == "active" && serve:
		// Booted before (the standby's Boot waited for it): machined's word
		// saves entering the node inside the downtime; the systemctl start
		// that follows fails on a node whose systemd is going down.
		if m, err := b.d.Systemd.Machine(ctx, slot); err == nil && m.State == "running" && m.Leader > 0 {
			return "running", nil
		}
	}
	// A node that failed before would otherwise stay failed in listings.
	if err := b.d.Systemd.ResetFailed(ctx, unitName(slot)); err != nil {
		b.log.Warn("could not reset the failed state of the node unit", "slot", slot, "err", err)
	}
	if err := b.d.Systemd.StartUnit(ctx, unitName(slot)); err != nil {
		return "", fmt.Errorf("start slot %s: %w", slot, err)
	}
	state, err := b.waitBooted(ctx, slot)
	if err != nil {
		return "", fmt.Errorf("start slot %s: %w", slot, err)
	}
	return state, nil
}

// servingMark is nodeconfig.ServingFile's content; only its presence counts.
const servingMark = "# Written by kubeslot: this slot's node serves (containerd and the kubelet start at its boot).\n"

// markServing writes nodeconfig.ServingFile into slot's rootfs. It stays
// there: a repave's old slot keeps it until the slot is removed, so a host
// that reboots before the commit boots the old slot serving again.
func (b *Backend) markServing(slot string) error {
	rootfs, err := b.slotDir(rootfsPath(slot))
	if err != nil {
		return err
	}
	_, err = nodeconfig.WriteFiles(rootfs, []nodeconfig.File{{Path: nodeconfig.ServingFile, Data: []byte(servingMark), Mode: 0o644}})
	return err
}

// waitBooted polls machined for the machine, then the node's systemd until
// it has finished booting. "degraded" (some unit failed) counts as booted,
// with a warning naming the failed units: an unrelated failure in the node
// must not keep the kubelet from starting. It returns the state seen.
func (b *Backend) waitBooted(ctx context.Context, slot string) (string, error) {
	last := "not registered with machined"
	for {
		m, err := b.d.Systemd.Machine(ctx, slot)
		switch {
		case err == nil && m.State == "running" && m.Leader > 0:
			out, _ := b.Exec(ctx, slot, "systemctl", "is-system-running")
			state := lastLine(out)
			switch state {
			case "running":
				return state, nil
			case "degraded":
				failed, _ := b.Exec(ctx, slot, "systemctl", "list-units", "--failed", "--plain", "--no-legend")
				b.log.Warn("node booted degraded", "slot", slot, "failed_units", strings.TrimSpace(string(failed)))
				return state, nil
			case "maintenance", "stopping":
				return state, fmt.Errorf("the node's systemd is %q", state)
			}
			last = "node systemd " + state
		case err == nil:
			last = "machine " + m.State
		case !isNoMachine(err):
			return "", err
		default:
			// Gone, or never there: a unit that failed will not bring it.
			if active, sub, uerr := b.d.Systemd.UnitState(ctx, unitName(slot)); uerr == nil && (active == "failed" || active == "inactive") {
				return "", fmt.Errorf("%s is %s/%s: the machine did not come up (journalctl -u %s)", unitName(slot), active, sub, unitName(slot))
			}
		}
		if err := sleep(ctx, machinePoll); err != nil {
			return "", fmt.Errorf("%w; last seen: %s", err, last)
		}
	}
}

func lastLine(out []byte) string {
	s := strings.TrimSpace(string(out))
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return strings.TrimSpace(s)
}

// nodeJournal is the tail of the node's kubelet and containerd logs, for
// error messages; best effort.
func (b *Backend) nodeJournal(ctx context.Context, slot string) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	out, err := b.Exec(ctx, slot, "journalctl", "-u", nodeconfig.KubeletUnit, "-u", nodeconfig.ContainerdUnit, "--no-pager", "-q", "-n", "40")
	if err != nil {
		return fmt.Sprintf("(node journal: %v)", err)
	}
	return "node journal:\n" + string(out)
}

// Stop stops slot's node gracefully: the kubelet, then containerd (one stop
// job each, queued together: the kubelet is ordered after containerd, so it
// stops first), then the machine: halted from inside (halt) once those two
// stopped, else through its unit, which shuts the node's systemd down unit
// by unit. If that fails or takes longer than timeouts.stop (plus a
// margin), the machine is terminated through machined. A node that does not
// run is fine; one that is stopping is waited for.
func (b *Backend) Stop(ctx context.Context, slot string) error {
	if err := b.checkSlot(slot); err != nil {
		return err
	}
	log := b.log.With("slot", slot)
	t0 := time.Now()
	m, err := b.d.Systemd.Machine(ctx, slot)
	running := err == nil
	if err != nil && !isNoMachine(err) {
		return fmt.Errorf("stop slot %s: %w", slot, err)
	}
	if running && m.State == "running" {
		n := b.nodeSystemd(ctx, slot)
		err := b.stopInNode(ctx, n, nodeconfig.KubeletUnit, nodeconfig.ContainerdUnit)
		halted := false
		if err != nil {
			log.Warn("could not stop kubelet and containerd inside the node; stopping the machine anyway", "err", err)
		} else if halted, err = b.halt(ctx, slot, n); !halted {
			log.Warn("could not halt the node from inside; stopping its machine", "err", err)
		}
		n.Close()
		if halted {
			if err != nil {
				return fmt.Errorf("stop slot %s: %w", slot, err)
			}
			log.Info("node stopped", "took", time.Since(t0).Round(time.Millisecond), "how", "halt")
			return nil
		}
	}
	active, _, err := b.d.Systemd.UnitState(ctx, unitName(slot))
	if err != nil {
		return fmt.Errorf("stop slot %s: %w", slot, err)
	}
	if !running && (active == "inactive" || active == "failed") {
		log.Info("node not running", "unit", active)
		return nil
	}
	stopErr := b.stopUnit(ctx, slot)
	if stopErr == nil {
		stopErr = b.waitGone(ctx, slot, terminateBound)
	}
	if stopErr != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("stop slot %s: %w", slot, stopErr)
		}
		log.Warn("graceful stop failed; terminating the machine", "err", stopErr)
		if err := b.terminate(ctx, slot); err != nil {
			return fmt.Errorf("stop slot %s: %v; %w", slot, stopErr, err)
		}
	}
	log.Info("node stopped", "took", time.Since(t0).Round(time.Millisecond))
	return nil
}

// stopInNode stops units in a running node through n, bounded by
// timeouts.stop (at most innerStopBound).
func (b *Backend) stopInNode(ctx context.Context, n hostapi.NodeSystemd, units ...string) error {
	ctx, cancel := context.WithTimeout(ctx, min(b.cfg.Timeouts.Stop.Duration, innerStopBound))
	defer cancel()
	return n.StopUnits(ctx, units...)
}

// stopUnit stops slot's machine unit, bounded by timeouts.stop plus a
// margin (systemd itself kills the machine after TimeoutStopSec).
func (b *Backend) stopUnit(ctx context.Context, slot string) error {
	bound := b.cfg.Timeouts.Stop.Duration + stopMargin
	sctx, cancel := context.WithTimeoutCause(ctx, bound, timeoutCause("stopping "+unitName(slot), bound, "timeouts.stop + margin"))
	defer cancel()
	return b.d.Systemd.StopUnit(sctx, unitName(slot))
}

// terminate kills slot's machine through machined and waits, bounded, for
// it to go; a machine already gone is fine.
func (b *Backend) terminate(ctx context.Context, slot string) error {
	if err := b.d.Systemd.TerminateMachine(ctx, slot); err != nil && !isNoMachine(err) {
		return fmt.Errorf("terminate: %w", err)
	}
	if err := b.waitGone(ctx, slot, terminateBound); err != nil {
		return fmt.Errorf("after terminate: %w", err)
	}
	return nil
}

// halt halts slot's running node without stopping its units one by one
// (systemctl --force halt), then waits for its machine to go and its unit
// to stop. Stop calls it once the kubelet and containerd stopped cleanly:
// what is left are the pods' processes, which get the SIGTERM, the wait
// and the SIGKILL of systemd-shutdown as in an orderly shutdown (where they
// get them last), and the node's own services, none of which keeps state
// that matters. What it skips is the unit-by-unit stop, with an unmount job
// for every mount (each container's rootfs and shm, each pod's network
// namespace: 0.15 s with three pods, more with more), which the machine's
// own mount namespace makes moot.
//
// halted false means the node did not take the halt and still runs, as it
// was: the caller stops it through its unit. A halted node not gone within
// timeouts.stop (what its unit's stop would allow) is terminated.
func (b *Backend) halt(ctx context.Context, slot string, n hostapi.NodeSystemd) (halted bool, err error) {
	stop := b.cfg.Timeouts.Stop.Duration
	hctx, cancel := context.WithTimeout(ctx, min(stop, innerStopBound))
	err = n.Halt(hctx)
	cancel()
	if err != nil {
		// The answer (or systemctl) may die with the node it halted; only
		// a node that still runs means it did not halt.
		if m, merr := b.d.Systemd.Machine(ctx, slot); merr == nil && m.State == "running" {
			return false, fmt.Errorf("halt slot %s from inside (systemctl --force halt): %w", slot, err)
		}
	}
	if err := b.waitGone(ctx, slot, stop); err != nil {
		if ctx.Err() != nil {
			return true, err
		}
		b.log.Warn("node halted but not gone within timeouts.stop; terminating its machine", "slot", slot, "err", err)
		if err := b.terminate(ctx, slot); err != nil {
			return true, fmt.Errorf("after the halt: %w", err)
		}
	}
	// Inactive already, or about to be: nspawn exits with its machine.
	return true, b.stopUnit(ctx, slot)
}

// waitGone waits, bounded, until machined no longer knows slot's machine.
func (b *Backend) waitGone(ctx context.Context, slot string, bound time.Duration) error {
	ctx, cancel := context.WithTimeoutCause(ctx, bound, timeoutCause("machine "+slot+" going away", bound, "fixed bound"))
	defer cancel()
	t0 := time.Now()
	for {
		m, err := b.d.Systemd.Machine(ctx, slot)
		if isNoMachine(err) {
			return nil
		}
		if err != nil {
			return err
		}
		poll := machinePoll
		if time.Since(t0) < goneFast {
			poll = gonePoll
		}
		if err := sleep(ctx, poll); err != nil {
			return fmt.Errorf("%w (machine still %s)", err, m.State)
		}
	}
}
