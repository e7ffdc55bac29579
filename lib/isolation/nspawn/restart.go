package nspawn

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/kubeslot/kubeslot/lib/nodeconfig"
)

// restartServices is a restart in place that keeps slot's machine: it stops
// containerd and the kubelet inside the running node and starts them again,
// so the node is down for a kubelet stop and start plus containerd's, and the
// pods' containers (their shims outlive containerd) keep running.
//
// It first does the pre-start hook's work in process, as a machine start
// would through the unit's ExecStartPre=. warm is false, and nothing has
// been stopped, when the machine has to restart instead: it does not run or
// does not serve, the hook cannot run, or the hook changed anything (and
// when containerd and the kubelet do not stop: the machine's stop deals
// with what is left). A
// changed .nspawn file (modules, devices) takes a new machine; a changed
// resolv.conf reaches only pod sandboxes made after it; a changed node
// address would need a daemon-reload in the node. Those are rare (the host
// changed while the node ran), and a machine restart applies them all.
func (b *Backend) restartServices(ctx context.Context, slot string) (warm bool, err error) {
	log := b.log.With("slot", slot)
	m, err := b.d.Systemd.Machine(ctx, slot)
	if err != nil || m.State != "running" {
		log.Info("restart: the machine is not running; restarting it", "state", m.State, "err", err)
		return false, nil
	}
	rootfs, err := b.slotDir(rootfsPath(slot))
	if err != nil {
		return false, err
	}
	if _, err := os.Stat(rootfs + nodeconfig.ServingFile); err != nil {
		log.Info("restart: the machine does not serve; restarting it", "err", err)
		return false, nil
	}
	_, changed, err := preStart(ctx, HookDeps{Root: b.root, Log: b.log, Record: b.d.Record, Settings: b.d.Settings}, slot)
	if err != nil {
		log.Warn("restart: the pre-start hook failed in process; restarting the machine, whose start runs it again", "err", err)
		return false, nil
	}
	if len(changed) > 0 {
		log.Info("restart: the host changed what the node takes from it; restarting the machine", "changed", changed)
		return false, nil
	}
	ctx, cancel, err := b.bootBound(ctx, slot)
	if err != nil {
		return false, err
	}
	defer cancel()
	t0 := time.Now()
	n := b.nodeSystemd(ctx, slot)
	defer n.Close()
	sctx, scancel := context.WithTimeout(ctx, min(b.cfg.Timeouts.Stop.Duration, innerStopBound))
	err = n.StopUnits(sctx, nodeconfig.KubeletUnit, nodeconfig.ContainerdUnit)
	scancel()
	if err != nil {
		log.Warn("restart: could not stop kubelet and containerd in the node; restarting the machine", "err", err)
		return false, nil
	}
	stopped := time.Since(t0)
	if err := n.StartUnits(ctx, nodeconfig.ContainerdUnit, nodeconfig.KubeletUnit); err != nil {
		return true, fmt.Errorf("restart slot %s: start containerd and kubelet in the node: %w\n%s", slot, err, b.nodeJournal(ctx, slot))
	}
	log.Info("node services restarted", "stop", stopped.Round(time.Millisecond), "total", time.Since(t0).Round(time.Millisecond))
	return true, nil
}
