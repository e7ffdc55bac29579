package nspawn

// Slot layering (DESIGN.md, "Slot layering"): a slot's rootfs is an overlay
// mount of three layers, so preparing a slot costs a few directories and a
// mount, whatever the size of the rootfs:
//
//	lower 1 (bottom): the verified clean tree, <base>/cache/trees/<digest>/rootfs
//	lower 2:          the artifact layer (kubelet, containerd, runc, CNI
//	                  plugins, the provisioning stamp), cached by artifact set
//	                  next to the tree (layers.go)
//	upper:            the slot's own writes (node files, the node's runtime
//	                  state), /var/lib/machines/.<slot>.layers/upper
//
// The mount is the host unit var-lib-machines-<slot>.mount (a file kubeslot
// writes and journals), so systemd-nspawn@<slot>.service, which has
// RequiresMountsFor=/var/lib/machines/<slot>, pulls it in at every start and
// at boot, and a missing upper fails the mount instead of booting the node
// on an empty directory. Its lowerdir names two links in the slot's layers
// directory, so the unit's bytes stay the same across repaves.
//
// The copy (provision.go) is the named fallback, chosen by a trial mount when
// a slot is built and recorded in the slot's stamp (rootfs_mechanism).

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

// The slot rootfs mechanisms, as recorded in a slot's stamp.
const (
	MechanismOverlay = "overlay"
	MechanismCopy    = "copy"
)

// Entries of a slot's layers directory.
const (
	layerRecordName = "layers.json"
	layerTreeLink   = "tree"      // link to the clean tree (lower 1)
	layerArtsLink   = "artifacts" // link to the artifact layer (lower 2)
	layerUpper      = "upper"
	layerWork       = "work"
)

// Host paths of a slot's layers.
func layersPath(slot string) string { return path.Join(hostroot.MachinesDir, "."+slot+".layers") }
func layersPartialPath(slot string) string {
	return path.Join(hostroot.MachinesDir, "."+slot+".layers.partial")
}
func mountUnitName(slot string) string { return escapePath(rootfsPath(slot)) + ".mount" }
func mountUnitPath(slot string) string { return path.Join(hostroot.UnitDir, mountUnitName(slot)) }

// MountUnitName is the host unit that mounts slot's rootfs when the slot is
// layered; stopping it unmounts the rootfs (a reset does, after the node).
func MountUnitName(slot string) string { return mountUnitName(slot) }

// escapePath is `systemd-escape --path`: the unit name of a mount point.
func escapePath(p string) string {
	p = strings.Trim(path.Clean(p), "/")
	if p == "" {
		return "-"
	}
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '/':
			b.WriteByte('-')
		case c == '.' && (i == 0 || p[i-1] == '/'):
			fmt.Fprintf(&b, `\x%02x`, c)
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == ':', c == '_', c == '.':
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, `\x%02x`, c)
		}
	}
	return b.String()
}

// layerRecord is <layers>/layers.json, written before the layers directory
// is renamed into place: a layers directory exists only complete.
type layerRecord struct {
	// Stamp is the slot's stamp (its Mechanism "overlay"); Stamp.RootFS
	// names the clean tree the upper was made over. An upper is never
	// mounted over another tree: overlayfs (without index) would mount it
	// silently, with the old tree's whiteouts and copies over the new one.
	Stamp Stamp `json:"stamp"`
	// Artifacts is the artifact layer's key (layers.go).
	Artifacts string    `json:"artifacts"`
	BuiltAt   time.Time `json:"builtAt"`
}

// readLayers reads slot's layer record; found is false without one.
func (b *Backend) readLayers(slot string) (rec layerRecord, found bool, err error) {
	dir, err := b.slotDir(layersPath(slot))
	if err != nil {
		return rec, false, err
	}
	f, err := os.Open(filepath.Join(dir, layerRecordName))
	if errors.Is(err, fs.ErrNotExist) {
		return rec, false, nil
	}
	if err != nil {
		return rec, false, err
	}
	defer f.Close()
	if err := decodeRecord(f, &rec); err != nil {
		return rec, false, fmt.Errorf("%s/%s: damaged layer record: %w", layersPath(slot), layerRecordName, err)
	}
	return rec, true, nil
}

// mounter makes the preflight's trial overlay mount. The slot's own mount
// is systemd's (the .mount unit); this only asks the kernel whether it
// would work here.
type mounter interface {
	Overlay(lower, upper, work, target string) error
	Unmount(target string) error
}

// sysMounter is the kernel's mount(2); it is used only with the root prefix
// "/", where local paths are the host's.
type sysMounter struct{}

func (sysMounter) Overlay(lower, upper, work, target string) error {
	return unix.Mount("overlay", target, "overlay", 0, "lowerdir="+lower+",upperdir="+upper+",workdir="+work)
}
func (sysMounter) Unmount(target string) error { return unix.Unmount(target, 0) }

const probeName = ".overlay-probe"

// chooseMechanism is the preflight of a slot build: a trial overlay mount
// with a scratch lower on the tree cache's filesystem and a scratch upper
// on the slots' filesystem (≈0.2 ms). It catches what keeps overlayfs from
// working here: no overlay in the kernel, an upper on overlayfs or NFS, a
// stack too deep, no trusted xattrs, no CAP_SYS_ADMIN. Else the copy, with
// the reason naming filesystems and paths.
func (b *Backend) chooseMechanism(trees, machines string) (mech, why string) {
	if b.mount == nil {
		return MechanismCopy, fmt.Sprintf("root prefix %s is not /: no trial mount", b.root.Prefix())
	}
	lower := filepath.Join(trees, probeName)
	probe := filepath.Join(machines, probeName)
	upper, work, target := filepath.Join(probe, "upper"), filepath.Join(probe, "work"), filepath.Join(probe, "merged")
	defer func() {
		for _, p := range []string{lower, probe} {
			if err := removeTree(p); err != nil {
				b.log.Warn("could not remove the overlay probe", "path", p, "err", err)
			}
		}
	}()
	for _, p := range []string{lower, probe} {
		if err := removeTree(p); err != nil { // left by a kill; a mount inside is refused here
			return MechanismCopy, fmt.Sprintf("overlay probe %s: %v", p, err)
		}
	}
	for _, d := range []string{trees, lower, probe, upper, work, target} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return MechanismCopy, fmt.Sprintf("overlay probe: %v", err)
		}
	}
	if err := b.mount.Overlay(lower, upper, work, target); err != nil {
		return MechanismCopy, fmt.Sprintf("trial overlay mount failed: lower %s on %s, upper %s on %s: %v",
			lower, fsName(trees), upper, fsName(machines), err)
	}
	if err := b.mount.Unmount(target); err != nil {
		return MechanismCopy, fmt.Sprintf("trial overlay unmount of %s: %v", target, err)
	}
	return MechanismOverlay, ""
}

// fsName names the filesystem holding p, for messages.
func fsName(p string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return "unknown filesystem (" + err.Error() + ")"
	}
	names := map[int64]string{0x794c7630: "overlayfs", 0x01021994: "tmpfs", 0xEF53: "ext4", 0x58465342: "xfs",
		0x9123683E: "btrfs", 0x6969: "nfs", 0x2fc12fc1: "zfs", 0x65735546: "fuse"}
	if n, ok := names[int64(st.Type)]; ok {
		return n
	}
	return fmt.Sprintf("filesystem type %#x", st.Type)
}

// mountUnit renders slot's mount unit. Every path in it names the slot's
// own layers directory, so a repave onto other artifacts writes the same
// bytes (one daemon-reload at the slot's first build).
func (b *Backend) mountUnit(slot string) ([]byte, error) {
	layers := layersPath(slot)
	if strings.ContainsAny(layers, ":,\\ \t\n%") {
		return nil, fmt.Errorf("slot %q: its layer paths cannot go into overlay mount options (':', ',', '\\', '%%' or spaces)", slot)
	}
	trees := b.root.HostPath(hostroot.CacheDir, treesDir)
	needs := hostroot.MachinesDir
	if !strings.ContainsAny(trees, " \t\n%\\") {
		needs += " " + trees
	}
	return fmt.Appendf(nil, `# Written by kubeslot: slot %[1]s's node rootfs, its clean tree and artifact layer
# read-only below its own upper layer. systemd-nspawn@%[1]s.service pulls it in.
[Unit]
Description=kubeslot node rootfs of slot %[1]s (overlay)
RequiresMountsFor=%[2]s

[Mount]
What=overlay
Where=%[3]s
Type=overlay
Options=lowerdir=%[4]s:%[5]s,upperdir=%[6]s,workdir=%[7]s
`, slot, needs, rootfsPath(slot), path.Join(layers, layerArtsLink), path.Join(layers, layerTreeLink),
		path.Join(layers, layerUpper), path.Join(layers, layerWork)), nil
}

// ensureMounted writes slot's mount unit when it differs (journalled
// first; a daemon-reload then), makes the mount point and starts the unit.
// Each step is idempotent, so a run killed anywhere heals on the next.
func (b *Backend) ensureMounted(ctx context.Context, slot string) error {
	data, err := b.mountUnit(slot)
	if err != nil {
		return err
	}
	unit, err := b.localEntry(mountUnitPath(slot))
	if err != nil {
		return err
	}
	if old, err := os.ReadFile(unit); err != nil || string(old) != string(data) {
		if err := b.journal(ownership.KindUnit, mountUnitPath(slot)); err != nil {
			return err
		}
		if err := atomicfile.WriteFile(unit, data, 0o644); err != nil {
			return fmt.Errorf("mount unit: %w", err)
		}
		if err := b.d.Systemd.Reload(ctx); err != nil {
			return err
		}
	}
	rootfs, err := b.slotDir(rootfsPath(slot))
	if err != nil {
		return err
	}
	if err := os.Mkdir(rootfs, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("mount point: %w", err)
	}
	t0 := time.Now()
	if err := b.d.Systemd.StartUnit(ctx, mountUnitName(slot)); err != nil {
		return fmt.Errorf("mount the rootfs of slot %s: %w", slot, err)
	}
	b.log.Info("slot rootfs mounted", "slot", slot, "unit", mountUnitName(slot), "took", time.Since(t0).Round(time.Microsecond))
	return nil
}

// provisionOverlay builds slot's layers (the caller removed what was there)
// and mounts them. Kill -9 at any point: a layers.partial directory is
// removed by the next run; a layers directory is complete (its record was
// written before the rename), and the next run only writes the unit and
// starts the mount.
func (b *Backend) provisionOverlay(ctx context.Context, slot string, src fetched, stamp Stamp) error {
	tree, err := b.cleanTree(ctx, stamp.RootFS, src["rootfs"])
	if err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	key, artsLocal, err := b.artifactLayer(ctx, filepath.Dir(tree), tree, src, stamp)
	if err != nil {
		return fmt.Errorf("artifact layer: %w", err)
	}
	for _, p := range []string{layersPartialPath(slot), layersPath(slot)} {
		if err := b.journal(ownership.KindMachineRootfs, p); err != nil {
			return err
		}
	}
	_, inUse := b.treesInUse()
	b.pruneArtifactLayers(filepath.Dir(tree), key, inUse)
	partial, err := b.slotDir(layersPartialPath(slot))
	if err != nil {
		return err
	}
	final, err := b.slotDir(layersPath(slot))
	if err != nil {
		return err
	}
	if err := removeTree(partial); err != nil {
		return err
	}
	if err := os.Mkdir(partial, 0o700); err != nil {
		return err
	}
	// The links name host paths: the host's systemd follows them.
	if err := os.Symlink(b.root.HostPath(hostroot.CacheDir, treesDir, stamp.RootFS, treeRootfs), filepath.Join(partial, layerTreeLink)); err != nil {
		return err
	}
	if err := os.Symlink(b.root.HostPath(hostroot.CacheDir, treesDir, stamp.RootFS, artsDir, key), filepath.Join(partial, layerArtsLink)); err != nil {
		return err
	}
	// The upper's root directory is what the node sees as "/": it takes
	// the tree root's owner and mode.
	var st unix.Stat_t
	if err := unix.Stat(tree, &st); err != nil {
		return err
	}
	upper := filepath.Join(partial, layerUpper)
	if err := os.Mkdir(upper, 0o755); err != nil {
		return err
	}
	if err := setMeta(upper, &st, false); err != nil {
		return fmt.Errorf("upper layer: %w", err)
	}
	if err := os.Mkdir(filepath.Join(partial, layerWork), 0o700); err != nil {
		return err
	}
	if err := atomicfile.WriteJSON(filepath.Join(partial, layerRecordName), layerRecord{Stamp: stamp, Artifacts: key, BuiltAt: time.Now().UTC()}, 0o600); err != nil {
		return err
	}
	if err := atomicfile.Rename(partial, final); err != nil {
		return fmt.Errorf("move %s into place: %w", partial, err)
	}
	b.log.Debug("slot layers in place", "slot", slot, "tree", tree, "artifacts", artsLocal)
	return b.ensureMounted(ctx, slot)
}

// teardown removes a stopped slot's rootfs whatever its mechanism: the
// mount unit stopped (unmounting the overlay), then the mount point or
// copied tree, the layers and their staging directories. The unit file
// stays: Remove deletes it, a rebuild writes the same bytes again.
func (b *Backend) teardown(ctx context.Context, slot string) error {
	if err := b.d.Systemd.StopUnit(ctx, mountUnitName(slot)); err != nil {
		return fmt.Errorf("unmount the rootfs of slot %s: %w", slot, err)
	}
	for _, p := range []string{rootfsPath(slot), partialPath(slot), layersPath(slot), layersPartialPath(slot)} {
		local, err := b.slotDir(p)
		if err != nil {
			return err
		}
		if err := removeTree(local); err != nil {
			return err
		}
	}
	return nil
}

// treesInUse lists the tree digests and artifact layer keys that slot
// layer records name, finished or not: a tree under a mounted slot must
// never go (the node's view of it would empty).
func (b *Backend) treesInUse() (trees, arts map[string]bool) {
	trees, arts = map[string]bool{}, map[string]bool{}
	for _, slot := range b.cfg.Isolation.Slots {
		if rec, found, err := b.readLayers(slot); err == nil && found {
			trees[rec.Stamp.RootFS] = true
			arts[rec.Artifacts] = true
		} else if err != nil {
			b.log.Warn("slot layer record unreadable: keeping every cached tree", "slot", slot, "err", err)
			return nil, nil
		}
	}
	return trees, arts
}

// removeMountUnit removes slot's mount unit file (the mount is stopped
// already), reloading systemd when there was one.
func (b *Backend) removeMountUnit(ctx context.Context, slot string) error {
	local, err := b.localEntry(mountUnitPath(slot))
	if err != nil {
		return err
	}
	if _, err := os.Lstat(local); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := b.removeFile(mountUnitPath(slot)); err != nil {
		return err
	}
	return b.d.Systemd.Reload(ctx)
}

// ReadMechanism reports how slot's rootfs under root is made (MechanismOverlay
// or MechanismCopy, and why no fast path was taken) from its layer record or
// stamp alone, without systemd: for `kubeslot status`. found is false when
// the slot has no rootfs.
func ReadMechanism(root *hostroot.Root, slot string) (mechanism, noFastPath string, found bool, err error) {
	s, found, err := (&Backend{root: root}).slotStamp(slot)
	return s.mechanism(), s.NoFastPath, found, err
}

// Probe is the rootfs mechanism preflight of `kubeslot-bootstrap --preflight`:
// the trial mount a slot build makes, in the nearest existing directories of
// the tree cache and of /var/lib/machines (a fresh host has neither), with
// its scratch directories removed again.
func Probe(root *hostroot.Root) (mechanism, noFastPath string) {
	b := &Backend{root: root, log: slog.New(slog.DiscardHandler)}
	if root.Prefix() == "/" {
		b.mount = sysMounter{}
	}
	var dirs []string
	for _, p := range []string{root.HostPath(hostroot.CacheDir, treesDir), hostroot.MachinesDir} {
		local, err := root.Resolve(p)
		if err != nil {
			return MechanismCopy, fmt.Sprintf("%s: %v", p, err)
		}
		for local != root.Prefix() && local != "/" {
			if fi, err := os.Stat(local); err == nil && fi.IsDir() {
				break
			}
			local = filepath.Dir(local)
		}
		dirs = append(dirs, local)
	}
	return b.chooseMechanism(dirs[0], dirs[1])
}
