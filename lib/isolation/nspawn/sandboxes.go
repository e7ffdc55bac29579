package nspawn

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
)

// CRISocket implements isolation.CRIEndpoint: containerd's socket lives in
// the node's own /run, which the host reaches through the machine leader's
// root (/proc/PID/root).
func (b *Backend) CRISocket(ctx context.Context, slot string) (string, error) {
	if err := b.checkSlot(slot); err != nil {
		return "", err
	}
	pid, err := b.leader(ctx, slot)
	if err != nil {
		return "", fmt.Errorf("CRI socket of slot %s: %w", slot, err)
	}
	proc, err := b.root.Resolve(fmt.Sprintf("/proc/%d", pid))
	if err != nil {
		return "", err
	}
	// root is a link only to readlink: the kernel follows it into the
	// node's own root, which is what hostroot takes as a prefix.
	node, err := hostroot.New(filepath.Join(proc, "root"), "")
	if err != nil {
		return "", fmt.Errorf("CRI socket of slot %s: %w", slot, err)
	}
	return node.Resolve(nodeconfig.ContainerdSocket)
}
