package repave

import (
	"context"
	"fmt"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/kuberelease"
)

// versionWait bounds how long a repave waits for the API server's version
// before it gives up (the node keeps running: this is before prepare
// changes anything).
const versionWait = time.Minute

// checkSkew refuses a desired Kubernetes version the API server's version
// does not allow under the upstream skew policy.
func (d *Deps) checkSkew(ctx context.Context, cfg *config.Config) error {
	wctx, cancel := context.WithTimeout(ctx, versionWait)
	defer cancel()
	var server string
	var err error
	for {
		if server, err = d.Cluster.ServerVersion(wctx, cfg); err == nil {
			break
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("version skew check: the API server's version: %w", err)
		case <-time.After(d.poll()):
		}
	}
	if err := kuberelease.CheckSkew(cfg.Kubernetes.Version, server); err != nil {
		return fmt.Errorf("refused: %w", err)
	}
	return nil
}

// checkBinary and checkNodeVersion make sure the slot runs the Kubernetes
// release cfg asks for, before anything is committed: the binary in the
// slot says so (at standby, before the old node stops), and so does the
// Node its kubelet registered (at verify). A mirror that
// serves another release's binary under a version's path, or an explicit
// artifacts.kubelet of another release, fails there and is rolled back.
func (d *Deps) checkBinary(ctx context.Context, b isolation.Backend, cfg *config.Config, slot string) error {
	want := cfg.Kubernetes.Version
	bin, err := b.KubeletVersion(ctx, slot)
	if err != nil {
		return err
	}
	if !kuberelease.SameRelease(bin, want) {
		return fmt.Errorf("the kubelet binary in slot %s reports %s, but kubernetes version %s was asked for (check artifacts.kubelet or the release mirror)", slot, bin, want)
	}
	return nil
}

// checkNodeVersion checks the release the Node reports, once its new
// kubelet has posted its status.
func (d *Deps) checkNodeVersion(ctx context.Context, cfg *config.Config) error {
	want := cfg.Kubernetes.Version
	node, err := d.Cluster.KubeletVersion(ctx, cfg)
	if err != nil {
		//lint:ignore ST1005 Node is the Kubernetes kind, named as kubectl names it
		return fmt.Errorf("Node %s's kubelet version: %w", cfg.Machine.NodeName, err)
	}
	if !kuberelease.SameRelease(node, want) {
		//lint:ignore ST1005 as above
		return fmt.Errorf("Node %s reports kubelet %s, but kubernetes version %s was asked for", cfg.Machine.NodeName, node, want)
	}
	d.Log.Info("kubelet version verified", "version", want, "node", node)
	return nil
}

// checkSandboxImage refuses a sandbox image the node could not get, before
// anything is built, when it differs from the old slot's: an unchanged one
// is already in containerd's image store, which both slots share, so a
// registry outage does not block a repave that keeps it.
func (d *Deps) checkSandboxImage(ctx context.Context, st *State) error {
	if d.SandboxImage == nil {
		return nil
	}
	if old, err := d.Store.LoadApplied(st.From); err == nil && old.Config.Node.Sandbox() == st.Desired.Node.Sandbox() {
		return nil
	}
	if err := d.SandboxImage(ctx, st.Desired); err != nil {
		return fmt.Errorf("refused: %w (spec.node.sandboxImage on the Machine, or the host's node.sandbox_image)", err)
	}
	return nil
}
