package nspawn

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/kubeslot/kubeslot/lib/nodeconfig"
)

// restartServices is a restart in place that keeps slot's machine: it
// restarts containerd inside the running node while the kubelet still
// serves (the kubelet only wants containerd, so it stays up; its CRI calls
// fail for that moment, and the pods' containers keep running, since their
// shims outlive containerd), then stops the kubelet and starts it again.
// The node is down from the kubelet's stop (down) until its new kubelet is
// Ready: the "kubelet stop plus a kubelet start".
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
		sctx, scancel := context.WithTimeout(ctx, min(b.cfg.Timeouts.Stop.Duration, innerStopBound))
		defer scancel()
		if err := n.StopUnits(sctx, unit); err != nil {
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
