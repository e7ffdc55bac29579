package repave

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/bootstrap"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

// NodeCluster is the real Cluster: the Node read with the node's own
// identity (lib/bootstrap's NodeCluster builds the client).
type NodeCluster struct {
	Root *hostroot.Root
	Log  *slog.Logger
}

// WaitReady polls the Node until it is Ready as posted by a kubelet started
// at since or later (bootstrap.NodeCluster.WaitNodeReadySince: a heartbeat
// from since's second on and a Lease renewed after since, so the old
// kubelet's last status is never taken for the new one's).
func (c *NodeCluster) WaitReady(ctx context.Context, cfg *config.Config, since time.Time) error {
	nc := &bootstrap.NodeCluster{Root: c.Root, Log: c.Log}
	return nc.WaitNodeReadySince(ctx, cfg, since)
}

// SetLabels implements Cluster with a JSON merge patch of the Node's
// labels, sent with the node's own identity: NodeRestriction lets a node
// label itself, except under node-restriction.kubernetes.io/ (lib/config
// refuses those). A label to drop that is not there is fine.
func (c *NodeCluster) SetLabels(ctx context.Context, cfg *config.Config, set map[string]string, drop []string) error {
	if len(set) == 0 && len(drop) == 0 {
		return nil
	}
	cs, err := c.clientset(cfg)
	if err != nil {
		return err
	}
	labels := map[string]*string{}
	for _, k := range drop {
		labels[k] = nil
	}
	for k, v := range set {
		labels[k] = &v
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if err != nil {
		return err
	}
	node := cfg.Machine.NodeName
	for {
		_, err = cs.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "kubeslot"})
		if err == nil || apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsNotFound(err) {
			break
		}
		select { // a transient failure: the apiserver may be busy right after the node came back
		case <-ctx.Done():
			return fmt.Errorf("patch the labels of Node %s: %w; last: %v", node, context.Cause(ctx), err)
		case <-time.After(time.Second):
		}
	}
	if err != nil {
		return fmt.Errorf("patch the labels of Node %s: %w", node, err)
	}
	return nil
}

// ServerVersion implements Cluster with the bootstrap's lookup (the node's
// identity; /version is readable by every client).
func (c *NodeCluster) ServerVersion(ctx context.Context, cfg *config.Config) (string, error) {
	return (&bootstrap.NodeCluster{Root: c.Root, Log: c.Log}).ServerVersion(ctx, cfg)
}

// KubeletVersion implements Cluster: the Node's
// status.nodeInfo.kubeletVersion.
func (c *NodeCluster) KubeletVersion(ctx context.Context, cfg *config.Config) (string, error) {
	cs, err := c.clientset(cfg)
	if err != nil {
		return "", err
	}
	n, err := cs.CoreV1().Nodes().Get(ctx, cfg.Machine.NodeName, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	return n.Status.NodeInfo.KubeletVersion, nil
}

func (c *NodeCluster) clientset(cfg *config.Config) (*kubernetes.Clientset, error) {
	nc := &bootstrap.NodeCluster{Root: c.Root, Log: c.Log}
	rc, err := nc.RESTConfig(cfg)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(rc)
}

// vendorUnitDirs are where the host's systemd ships the unit files the boot
// links name (for nspawn, systemd-nspawn@.service).
var vendorUnitDirs = []string{"/usr/lib/systemd/system", "/lib/systemd/system"}

// BootLinks is the real Boot: the enable link that starts a slot's node at
// host boot (Mode.BootLink; for nspawn, systemd-nspawn@<slot>.service in
// machines.target.wants), moved from one slot to the other, journalled in
// the ownership record before it is created (as the bootstrap does).
type BootLinks struct {
	Root    *hostroot.Root
	Record  *ownership.Record
	Systemd isolation.SystemdConn
	Log     *slog.Logger
	// Mode is the isolation mode whose boot links move; the empty mode is
	// isolation.DefaultMode.
	Mode isolation.Mode
}

func (b *BootLinks) bootLink(slot string) string { return b.Mode.BootLink(slot).Path }

func (b *BootLinks) local(hostPath string) (string, error) {
	dir, err := b.Root.Resolve(path.Dir(hostPath))
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, path.Base(hostPath)), nil
}

// Move implements Boot. It is idempotent: a re-run after a crash finds the
// new link in place and the old one gone.
func (b *BootLinks) Move(ctx context.Context, from, to string) error {
	fromL, err := b.local(b.bootLink(from))
	if err != nil {
		return err
	}
	toL, err := b.local(b.bootLink(to))
	if err != nil {
		return err
	}
	changed := false
	if _, err := os.Lstat(toL); errors.Is(err, fs.ErrNotExist) {
		target, unit := "", b.Mode.BootLink(to).Unit
		if t, err := os.Readlink(fromL); err == nil {
			target = t
		} else {
			for _, dir := range vendorUnitDirs {
				if l, err := b.Root.Resolve(path.Join(dir, unit)); err == nil {
					if _, err := os.Stat(l); err == nil {
						target = path.Join(dir, unit)
						break
					}
				}
			}
		}
		if target == "" {
			return fmt.Errorf("enable %s at boot: no %s in %v", b.bootLink(to), unit, vendorUnitDirs)
		}
		if _, found := b.Record.Lookup(ownership.KindUnit, b.bootLink(to)); !found {
			prior, err := ownership.CapturePrior(b.Root, b.bootLink(to))
			if err != nil {
				return err
			}
			if err := b.Record.Record(b.Root, ownership.Change{Kind: ownership.KindUnit, Path: b.bootLink(to), Prior: prior}); err != nil {
				return err
			}
		}
		if err := os.MkdirAll(filepath.Dir(toL), 0o755); err != nil {
			return fmt.Errorf("enable %s at boot: %w", b.bootLink(to), err)
		}
		tmp := toL + ".kubeslot-tmp"
		_ = os.Remove(tmp)
		if err := os.Symlink(target, tmp); err != nil {
			return fmt.Errorf("enable %s at boot: %w", b.bootLink(to), err)
		}
		if err := atomicfile.Rename(tmp, toL); err != nil {
			return fmt.Errorf("enable %s at boot: %w", b.bootLink(to), err)
		}
		changed = true
	} else if err != nil {
		return err
	}
	if _, err := os.Lstat(fromL); err == nil {
		if err := atomicfile.Remove(fromL); err != nil {
			return fmt.Errorf("disable %s at boot: %w", b.bootLink(from), err)
		}
		changed = true
	}
	if changed {
		b.Log.Info("node start at boot moved", "from", b.bootLink(from), "to", b.bootLink(to))
		if b.Systemd != nil {
			return b.Systemd.Reload(ctx)
		}
	}
	return nil
}
