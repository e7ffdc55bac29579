package nspawn

import (
	"context"
	"fmt"
	"time"

	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
)

// Operator is the nspawn node operator: lifecycle hooks and restart in
// place, over its own Backend. A repave is the repaver's sequence of
// Backend steps (lib/repave), not the operator's.
type Operator struct {
	b *Backend
}

// NewOperator binds an operator to d (see New).
func NewOperator(d hostapi.Deps) (*Operator, error) {
	b, err := New(d)
	if err != nil {
		return nil, err
	}
	return &Operator{b: b}, nil
}

// Backend is the operator's backend.
func (o *Operator) Backend() *Backend { return o.b }

// EnsureHooks makes sure every provisioned slot's host side (the .nspawn
// settings and the unit drop-in) is what this configuration renders, and
// reloads systemd only when a drop-in changed. It never starts, stops or
// restarts anything: a running node picks changes up at its next start.
func (o *Operator) EnsureHooks(ctx context.Context) error {
	reload := false
	for _, slot := range o.b.cfg.Isolation.Slots {
		ok, err := o.b.stamped(slot)
		if err != nil {
			return fmt.Errorf("lifecycle hooks: %w", err)
		}
		if !ok {
			continue // nothing to run there yet
		}
		changed, dropIn, err := o.b.writeHostFiles(slot)
		if err != nil {
			return fmt.Errorf("lifecycle hooks of slot %s: %w", slot, err)
		}
		if len(changed) > 0 {
			o.b.log.Info("lifecycle hooks repaired", "slot", slot, "changed", changed)
		}
		reload = reload || dropIn
	}
	if reload {
		return o.b.d.Systemd.Reload(ctx)
	}
	return nil
}

// RestartNode restarts slot's node in place (never the host), then waits,
// bounded, for the kubelet's health; the caller checks the Node in the
// cluster. A running, serving node whose host-dependent settings are as
// the pre-start hook would write them keeps its machine: containerd, then
// the kubelet, restart inside it, and its pods keep running
// (restartServices). Any other node restarts its machine: graceful Stop,
// then Start, whose unit runs the hook. down is when the node stopped
// serving: the kubelet's stop, or the machine's.
func (o *Operator) RestartNode(ctx context.Context, slot string) (down time.Time, err error) {
	t0 := time.Now()
	how := "services"
	down, warm, err := o.b.restartServices(ctx, slot)
	if err != nil {
		return down, fmt.Errorf("restart node: %w", err)
	}
	if !warm {
		how, down = "machine", time.Now()
		if err := o.b.Stop(ctx, slot); err != nil {
			return down, fmt.Errorf("restart node: %w", err)
		}
		if err := o.b.Start(ctx, slot); err != nil {
			return down, fmt.Errorf("restart node: %w", err)
		}
	}
	if err := o.b.WaitKubeletHealthy(ctx, slot); err != nil {
		return down, fmt.Errorf("restart node: %w", err)
	}
	o.b.log.Info("node restarted", "slot", slot, "how", how, "took", time.Since(t0).Round(time.Millisecond),
		"down", time.Since(down).Round(time.Millisecond))
	return down, nil
}

// stamped reports whether slot has a finished rootfs (from any artifacts).
func (b *Backend) stamped(slot string) (bool, error) {
	rootfs, err := b.slotDir(rootfsPath(slot))
	if err != nil {
		return false, err
	}
	_, found, err := readStamp(rootfs)
	return found, err
}
