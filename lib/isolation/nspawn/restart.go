package nspawn

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
)

// restartServices is a restart in place that keeps slot's machine: it
// restarts containerd inside the running node while the kubelet still
// serves (the kubelet only wants containerd, so it stays up; its CRI calls
// fail for that moment, and the pods' containers keep running, since their
// shims outlive containerd), then stops the kubelet and starts it again.
// The node is down from the kubelet's stop (down) until its new kubelet is
// Ready: a kubelet stop plus a kubelet start, the floor of a warm standby.
//
// It first does the pre-start hook's work in process, as a machine start
// would through the unit's ExecStartPre=. warm is false, and nothing has
// been stopped, when the machine has to restart instead: it does not run or
// does not serve, the hook cannot run, or the hook changed anything (and
// when containerd or the kubelet does not stop: the machine's stop deals
// with what is left). A changed .nspawn file (modules, devices) takes a new
// machine; a changed resolv.conf reaches only pod sandboxes made after it; a
// changed node address would need a daemon-reload in the node. Those are
// rare (the host changed while the node ran), and a machine restart applies
// them all.
func (b *Backend) restartServices(ctx context.Context, slot string) (down time.Time, warm bool, err error) {
	log := b.log.With("slot", slot)
	m, err := b.d.Systemd.Machine(ctx, slot)
	if err != nil || m.State != "running" {
		log.Info("restart: the machine is not running; restarting it", "state", m.State, "err", err)
		return down, false, nil
	}
	rootfs, err := b.slotDir(rootfsPath(slot))
	if err != nil {
		return down, false, err
	}
	if _, err := os.Stat(rootfs + nodeconfig.ServingFile); err != nil {
		log.Info("restart: the machine does not serve; restarting it", "err", err)
		return down, false, nil
	}
	_, changed, err := preStart(ctx, HookDeps{Root: b.root, Log: b.log, Record: b.d.Record, Settings: b.d.Settings}, slot)
	if err != nil {
		log.Warn("restart: the pre-start hook failed in process; restarting the machine, whose start runs it again", "err", err)
		return down, false, nil
	}
	if len(changed) > 0 {
		log.Info("restart: the host changed what the node takes from it; restarting the machine", "changed", changed)
		return down, false, nil
	}
	ctx, cancel, err := b.bootBound(ctx, slot)
	if err != nil {
		return down, false, err
	}
	defer cancel()
	n := b.nodeSystemd(ctx, slot)
	defer n.Close()
	stop := func(unit string) bool {
		if err := b.stopInNode(ctx, n, unit); err != nil {
			log.Warn("restart: could not stop "+unit+" in the node; restarting the machine", "err", err)
			return false
		}
		return true
	}
	start := func(unit string) error {
		if err := n.StartUnits(ctx, unit); err != nil {
			return fmt.Errorf("restart slot %s: start %s in the node: %w\n%s", slot, unit, err, b.nodeJournal(ctx, slot))
		}
		return nil
	}
	t0 := time.Now()
	if !stop(nodeconfig.ContainerdUnit) {
		return down, false, nil
	}
	if err := start(nodeconfig.ContainerdUnit); err != nil {
		return down, true, err
	}
	b.waitPreloadCheck(ctx, n, slot)
	down = time.Now()
	if !stop(nodeconfig.KubeletUnit) {
		return down, false, nil
	}
	if err := start(nodeconfig.KubeletUnit); err != nil {
		return down, true, err
	}
	log.Info("node services restarted", "containerd", down.Sub(t0).Round(time.Millisecond),
		"kubelet", time.Since(down).Round(time.Millisecond))
	return down, true, nil
}

// Warm reports whether slot's machine runs (isolation.RuntimeHandover).
func (b *Backend) Warm(ctx context.Context, slot string) bool {
	if b.checkSlot(slot) != nil {
		return false
	}
	m, err := b.d.Systemd.Machine(ctx, slot)
	return err == nil && m.State == "running" && m.Leader > 0
}

// StopRuntime stops containerd in slot's running node, bounded; the
// kubelet only wants containerd, so it keeps serving, and the pods' shims
// outlive containerd (isolation.RuntimeHandover).
func (b *Backend) StopRuntime(ctx context.Context, slot string) error {
	if err := b.checkSlot(slot); err != nil {
		return err
	}
	n := b.nodeSystemd(ctx, slot)
	defer n.Close()
	if err := b.stopInNode(ctx, n, nodeconfig.ContainerdUnit); err != nil {
		return fmt.Errorf("stop containerd in slot %s: %w", slot, err)
	}
	return nil
}

// StartRuntime marks slot's running node as serving and starts its
// containerd, not its kubelet, whose start (Start) pulls in what must wait
// for the old node's machine to be gone (isolation.RuntimeHandover).
func (b *Backend) StartRuntime(ctx context.Context, slot string) error {
	ctx, cancel, err := b.bootBound(ctx, slot)
	if err != nil {
		return err
	}
	defer cancel()
	if !b.Warm(ctx, slot) {
		return fmt.Errorf("start containerd in slot %s: its machine does not run", slot)
	}
	if err := b.markServing(slot); err != nil {
		return fmt.Errorf("start containerd in slot %s: %w", slot, err)
	}
	n := b.nodeSystemd(ctx, slot)
	defer n.Close()
	if err := n.StartUnits(ctx, nodeconfig.ContainerdUnit); err != nil {
		return fmt.Errorf("start containerd in slot %s: %w\n%s", slot, err, b.nodeJournal(ctx, slot))
	}
	b.waitPreloadCheck(ctx, n, slot)
	return nil
}

// waitPreloadCheck waits for the preload's check that containerd's start
// pulled in (nodeconfig.PreloadVerifyUnit), so that it runs while the old
// kubelet still serves, not beside the new kubelet's start or its pods'. A
// failure is a warning: the kubelet pulls what is missing, or fails to.
func (b *Backend) waitPreloadCheck(ctx context.Context, n hostapi.NodeSystemd, slot string) {
	if len(b.cfg.Node.PreloadImages) == 0 {
		return
	}
	if err := n.StartUnits(ctx, nodeconfig.PreloadVerifyUnit); err != nil {
		b.log.Warn("the preloaded images' check failed; see its journal in the node", "slot", slot, "err", err)
	}
}
