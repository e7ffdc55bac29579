package nspawn

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kubeslot/kubeslot/lib/artifact"
	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
)

// PatchKubelet installs the kubelet of the backend's configuration into
// slot's node in place (isolation.KubeletPatcher): the verified binary is
// renamed over the node's through its rootfs (on a layered slot that lands
// in its upper; the lowers are shared and never written), then the slot's
// stamp and layer record name it, and the node's files are rendered again
// (Configure). Nothing is stopped: the running kubelet serves until the
// node's restart. Only the kubelet may differ from what the slot was built
// from; anything else is refused, as it needs a new slot. Idempotent, and
// the way back too (the previous configuration's backend patches the old
// kubelet in again).
func (b *Backend) PatchKubelet(ctx context.Context, slot string) error {
	if err := b.checkSlot(slot); err != nil {
		return err
	}
	have, found, err := b.slotStamp(slot)
	if err != nil {
		return fmt.Errorf("patch slot %s: %w", slot, err)
	}
	if !found {
		return fmt.Errorf("patch slot %s: the slot is not provisioned", slot)
	}
	want := b.wantStamp()
	if want.Kubelet == "" {
		return fmt.Errorf("patch slot %s: the kubelet of kubernetes %s is not pinned", slot, b.cfg.Kubernetes.Version)
	}
	if other := (func() Stamp { s := have; s.Kubelet = want.Kubelet; return s })(); !other.sameBuild(want) {
		return fmt.Errorf("patch slot %s: it was built from other artifacts than the kubelet's (has %+v, wants %+v): only a repave can change them", slot, have, want)
	}
	if have.mechanism() == MechanismOverlay {
		if err := b.ensureMounted(ctx, slot); err != nil {
			return fmt.Errorf("patch slot %s: %w", slot, err)
		}
	}
	if have.Kubelet != want.Kubelet {
		if err := b.installKubelet(ctx, slot, have, want.Kubelet); err != nil {
			return fmt.Errorf("patch slot %s: %w", slot, err)
		}
		b.log.Info("kubelet replaced in the slot's node", "slot", slot, "version", b.cfg.Kubernetes.Version, "sha256", want.Kubelet)
	}
	return b.Configure(ctx, slot)
}

// installKubelet fetches the configuration's kubelet (verified, through
// the cache), renames it over the node's, then records it in the stamp:
// a kill between the two installs it again.
func (b *Backend) installKubelet(ctx context.Context, slot string, have Stamp, sha string) error {
	if d := b.cfg.Timeouts.Download.Duration; d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, d, fmt.Errorf("kubelet download not done within %s (timeouts.download)", d))
		defer cancel()
	}
	kubelet, f, err := b.kubeletFetcher(&artifact.Fetcher{Root: b.root, Log: b.log, Timeout: b.cfg.Timeouts.Download.Duration})
	if err != nil {
		return err
	}
	src, err := f.Ensure(ctx, kubelet.URL, kubelet.SHA256)
	if err != nil {
		return fmt.Errorf("kubelet: %w", err)
	}
	rootfs, err := b.slotDir(rootfsPath(slot))
	if err != nil {
		return err
	}
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := copyInto(root, src, nodeconfig.KubeletBinary); err != nil {
		return err
	}
	stamp := have
	stamp.Kubelet = sha
	data, err := json.MarshalIndent(stamp, "", "  ")
	if err != nil {
		return err
	}
	if err := writeInto(root, "/"+stampPath, bytes.NewReader(append(data, '\n')), 0o644); err != nil {
		return err
	}
	if err := syncfs(rootfs); err != nil {
		return err
	}
	if have.mechanism() != MechanismOverlay {
		return nil
	}
	rec, _, err := b.readLayers(slot)
	if err != nil {
		return err
	}
	rec.Stamp = stamp
	layers, err := b.slotDir(layersPath(slot))
	if err != nil {
		return err
	}
	return atomicfile.WriteJSON(filepath.Join(layers, layerRecordName), rec, 0o600)
}
