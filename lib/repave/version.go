package repave

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// versionWait bounds how long a repave waits for the API server's version
// before it gives up (the node keeps running: this is before prepare
// changes anything).
const versionWait = time.Minute

// checkSkew refuses a desired Kubernetes version the API server's version
// does not allow under the upstream skew policy (slot.Tasks.Skew), and one
// it could not check: the API server must say its version within
// versionWait.
func (d *Deps) checkSkew(ctx context.Context, st *State) error {
	server, known, err := d.tasks().Skew(ctx, st.Desired, versionWait)
	if err == nil && !known {
		err = errors.New("version skew check: the API server's version: " + server)
	}
	return err
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
