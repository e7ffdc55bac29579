package nspawn

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/artifact"
	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/kuberelease"
	"github.com/kubeslot/kubeslot/lib/mountinfo"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
	"github.com/kubeslot/kubeslot/lib/oci"
	"github.com/kubeslot/kubeslot/lib/oci/ociref"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/unpack"
)

// stampPath is the provisioning stamp inside a slot rootfs: which rootfs
// and artifacts the tree was built from. It is written into the staging
// tree before the rename that makes the slot, so a slot directory without
// it was not made by kubeslot (or by no finished Provision).
const stampPath = "etc/kubeslot/provisioned.json"

// Stamp says what a slot rootfs was built from: sha256 digests.
type Stamp struct {
	RootFS     string `json:"rootfs"`
	Kubelet    string `json:"kubelet"`
	Containerd string `json:"containerd,omitempty"`
	Runc       string `json:"runc,omitempty"`
	CNIPlugins string `json:"cni_plugins,omitempty"`
	// Mechanism is how the rootfs was made: MechanismOverlay (layers over
	// the clean tree, overlay.go) or MechanismCopy ("" in stamps written
	// before there was a choice). NoFastPath says why a copy was chosen.
	Mechanism  string `json:"rootfs_mechanism,omitempty"`
	NoFastPath string `json:"no_fast_path,omitempty"`
}

// sameBuild reports whether two stamps name the same rootfs and artifacts,
// however the rootfs was made.
func (s Stamp) sameBuild(o Stamp) bool {
	s.Mechanism, s.NoFastPath, o.Mechanism, o.NoFastPath = "", "", "", ""
	return s == o
}

// mechanism is s.Mechanism, with the copy for stamps that predate it.
func (s Stamp) mechanism() string {
	if s.Mechanism == "" {
		return MechanismCopy
	}
	return s.Mechanism
}

// slotStamp reads slot's stamp: a layered slot's from its layer record
// (its rootfs is an empty mount point while the mount is not active), a
// copied slot's from its rootfs.
func (b *Backend) slotStamp(slot string) (s Stamp, found bool, err error) {
	rec, found, err := b.readLayers(slot)
	if err != nil || found {
		return rec.Stamp, found, err
	}
	rootfs, err := b.slotDir(rootfsPath(slot))
	if err != nil {
		return s, false, err
	}
	return readStamp(rootfs)
}

func (b *Backend) wantStamp() Stamp {
	a := b.cfg.Artifacts
	k, _ := b.cfg.KubeletArtifact() // unpinned: "", never equal to a built slot's stamp
	s := Stamp{RootFS: b.cfg.RootFS.SHA256, Kubelet: k.SHA256}
	if a.Containerd != nil {
		s.Containerd = a.Containerd.SHA256
	}
	if a.Runc != nil {
		s.Runc = a.Runc.SHA256
	}
	if a.CNIPlugins != nil {
		s.CNIPlugins = a.CNIPlugins.SHA256
	}
	return s
}

// readStamp reads a rootfs's stamp; found is false when the rootfs or the
// stamp does not exist.
func readStamp(rootfs string) (s Stamp, found bool, err error) {
	root, err := os.OpenRoot(rootfs)
	if errors.Is(err, fs.ErrNotExist) {
		return s, false, nil
	}
	if err != nil {
		return s, false, err
	}
	defer root.Close()
	f, err := root.Open(stampPath)
	if errors.Is(err, fs.ErrNotExist) {
		return s, false, nil
	}
	if err != nil {
		return s, false, err
	}
	defer f.Close()
	if err := decodeRecord(f, &s); err != nil {
		return s, false, fmt.Errorf("%s/%s: damaged provisioning stamp: %w", rootfs, stampPath, err)
	}
	return s, true, nil
}

// decodeRecord decodes one of the backend's own small JSON records (a slot's
// stamp, its layer record) into v: bounded, and strict, so a field this
// release does not know is a damaged record rather than one silently dropped.
func decodeRecord(r io.Reader, v any) error {
	dec := json.NewDecoder(io.LimitReader(r, 64<<10))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// Provisioned reports whether slot has a rootfs built from exactly this
// configuration's rootfs and artifacts.
func (b *Backend) Provisioned(slot string) (bool, error) {
	if err := b.checkSlot(slot); err != nil {
		return false, err
	}
	have, found, err := b.slotStamp(slot)
	return found && have.sameBuild(b.wantStamp()), err
}

// Provision builds slot's rootfs from the verified artifact cache. The
// clean tree of the rootfs tarball (or of an OCI image's flattened tarball,
// lib/oci) is unpacked once into the tree cache (tree.go); then, chosen by
// a trial mount (chooseMechanism) and recorded in the slot's stamp, either
//
//   - overlay: the tree and an artifact layer below the slot's own upper
//     layer, mounted by the slot's mount unit (overlay.go), in O(1) of the
//     rootfs size; or
//   - copy, the named fallback: a copy of the tree in a fresh staging
//     directory next to the slot, the kubelet (and the optional containerd,
//     runc and CNI plugins) installed into it, the stamp written, then
//     renamed into place, so a half-built tree is never taken for a slot.
//
// Every artifact is fetched and verified before anything is created. A slot
// already built from the same artifacts is left as it is (a layered one is
// mounted); one built from others is rebuilt, unless its node is running.
func (b *Backend) Provision(ctx context.Context, slot string) error {
	if err := b.checkSlot(slot); err != nil {
		return err
	}
	log := b.log.With("slot", slot)
	t0 := time.Now()
	rootfs, err := b.slotDir(rootfsPath(slot))
	if err != nil {
		return err
	}
	want := b.wantStamp()
	have, found, err := b.slotStamp(slot)
	if err != nil {
		return fmt.Errorf("provision slot %s: %w", slot, err)
	}
	if found && have.sameBuild(want) && (have.mechanism() == MechanismCopy || b.haveTree(have.RootFS)) {
		if have.mechanism() == MechanismOverlay {
			if err := b.ensureMounted(ctx, slot); err != nil {
				return fmt.Errorf("provision slot %s: %w", slot, err)
			}
		}
		log.Info("slot already provisioned from these artifacts", "rootfs", rootfs, "mechanism", have.mechanism())
		return nil
	}

	// Fetch and verify everything first: a wrong checksum must leave the
	// slot untouched.
	fetched, err := b.fetchAll(ctx, b.haveTree(want.RootFS))
	if err != nil {
		return fmt.Errorf("provision slot %s: %w", slot, err)
	}

	layers, err := b.slotDir(layersPath(slot))
	if err != nil {
		return err
	}
	_, rerr := os.Lstat(rootfs)
	_, lerr := os.Lstat(layers)
	if rerr == nil || lerr == nil {
		if err := b.checkOurs(slot, rootfs, found); err != nil {
			return fmt.Errorf("provision slot %s: %w", slot, err)
		}
		if err := b.checkStopped(ctx, slot); err != nil {
			return fmt.Errorf("provision slot %s: its rootfs was built from other artifacts, and %w", slot, err)
		}
		log.Info("rebuilding slot rootfs built from other artifacts", "rootfs", rootfs, "had", have, "want", want)
	} else if !errors.Is(rerr, fs.ErrNotExist) {
		return fmt.Errorf("provision slot %s: %w", slot, rerr)
	}

	if err := b.ensureDir(hostroot.MachinesDir, 0o700); err != nil {
		return fmt.Errorf("provision slot %s: %w", slot, err)
	}
	for _, p := range []string{partialPath(slot), rootfsPath(slot)} {
		if err := b.journal(ownership.KindMachineRootfs, p); err != nil {
			return fmt.Errorf("provision slot %s: %w", slot, err)
		}
	}
	// What a kill or an older build left: the mount stopped first.
	if err := b.teardown(ctx, slot); err != nil {
		return fmt.Errorf("provision slot %s: %w", slot, err)
	}
	trees, err := b.root.Path(hostroot.CacheDir, treesDir)
	if err != nil {
		return err
	}
	machines, err := b.local(hostroot.MachinesDir)
	if err != nil {
		return err
	}
	t1 := time.Now()
	want.Mechanism, want.NoFastPath = b.chooseMechanism(trees, machines)
	if want.Mechanism == MechanismCopy {
		log.Warn("no fast path for the slot rootfs: copying the clean tree", "reason", want.NoFastPath)
		err = b.provisionCopy(ctx, slot, fetched, want)
	} else {
		err = b.provisionOverlay(ctx, slot, fetched, want)
	}
	if err != nil {
		return fmt.Errorf("provision slot %s: %w", slot, err)
	}
	log.Info("slot provisioned", "rootfs", rootfs, "mechanism", want.Mechanism,
		"build", time.Since(t1).Round(time.Microsecond), "total", time.Since(t0).Round(time.Microsecond))
	return nil
}

// provisionCopy builds slot's rootfs as a copy of the clean tree in its
// staging directory and renames it into place.
func (b *Backend) provisionCopy(ctx context.Context, slot string, fetched fetched, want Stamp) error {
	partial, err := b.slotDir(partialPath(slot))
	if err != nil {
		return err
	}
	rootfs, err := b.slotDir(rootfsPath(slot))
	if err != nil {
		return err
	}
	// A slot layered before would pull in its mount over the copy.
	if err := b.removeMountUnit(ctx, slot); err != nil {
		return err
	}
	if err := b.build(ctx, partial, fetched, want); err != nil {
		if rerr := removeTree(partial); rerr != nil {
			b.log.Warn("could not remove the staging tree", "path", partial, "err", rerr)
		}
		return err
	}
	if err := atomicfile.Rename(partial, rootfs); err != nil {
		return fmt.Errorf("move %s into place: %w", partial, err)
	}
	return nil
}

// fetched maps an artifact's role to its verified cache file.
type fetched map[string]string

// fetchAll fetches and verifies every artifact into the cache; the rootfs
// tarball is skipped when haveTree: its clean tree was unpacked from the
// verified tarball and is named by the same digest, and hashing a large
// tarball again would cost as much as the copy.
func (b *Backend) fetchAll(ctx context.Context, haveTree bool) (fetched, error) {
	// timeouts.download bounds all of them together, as the stage's budget
	// counts it (config.StageBudget), not each one.
	if d := b.cfg.Timeouts.Download.Duration; d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, d, fmt.Errorf("downloads not done within %s (timeouts.download)", d))
		defer cancel()
	}
	f := &artifact.Fetcher{Root: b.root, Log: b.log, Timeout: b.cfg.Timeouts.Download.Duration}
	kubelet, kf, err := b.kubeletFetcher(f)
	if err != nil {
		return nil, err
	}
	out := fetched{}
	items := []struct {
		role string
		a    *config.Artifact
	}{
		{"rootfs", &config.Artifact{URL: b.cfg.RootFS.Source, SHA256: b.cfg.RootFS.SHA256}},
		{"kubelet", &kubelet},
		{"containerd", b.cfg.Artifacts.Containerd},
		{"runc", b.cfg.Artifacts.Runc},
		{"cni_plugins", b.cfg.Artifacts.CNIPlugins},
	}
	for _, it := range items {
		if it.a == nil || (it.role == "rootfs" && haveTree) {
			continue
		}
		ensure := f.Ensure
		if it.role == "kubelet" {
			ensure = kf.Ensure
		}
		if it.role == "rootfs" && ociref.Is(it.a.URL) {
			// An image is pulled and flattened into a tarball in the
			// cache; the slot is then built from it like from any rootfs.
			ensure = (&oci.Fetcher{Root: b.root, Log: b.log, Timeout: f.Timeout}).Ensure
		}
		p, err := ensure(ctx, it.a.URL, it.a.SHA256)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", it.role, err)
		}
		out[it.role] = p
	}
	return out, nil
}

// kubeletFetcher is the configuration's kubelet and the fetcher for it: f,
// or for a kubelet from the release mirror one that trusts the mirror's CA,
// as its checksum did.
func (b *Backend) kubeletFetcher(f *artifact.Fetcher) (config.Artifact, *artifact.Fetcher, error) {
	kubelet, err := b.cfg.KubeletArtifact()
	if err != nil || b.cfg.Artifacts.Kubelet.URL != "" {
		return kubelet, f, err
	}
	c, err := kuberelease.Client(b.root, b.cfg.Kubernetes.Release)
	if err != nil {
		return kubelet, nil, err
	}
	return kubelet, &artifact.Fetcher{Root: b.root, Log: b.log, Timeout: f.Timeout, Client: c}, nil
}

// build makes the staging tree: rootfs, artifacts, stamp, synced.
func (b *Backend) build(ctx context.Context, dir string, src fetched, stamp Stamp) error {
	// The rootfs: a copy of the digest's clean tree, unpacked once.
	tree, err := b.cleanTree(ctx, stamp.RootFS, src["rootfs"])
	if err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	t0 := time.Now()
	cs, err := copyTree(ctx, tree, dir)
	if err != nil {
		return fmt.Errorf("rootfs: copy of the cached tree %s: %w", tree, err)
	}
	b.log.Info("rootfs copied from the cached tree", "tree", tree, "files", cs.Files, "dirs", cs.Dirs,
		"symlinks", cs.Symlinks, "hardlinks", cs.Hardlinks, "special", cs.Special, "bytes", cs.Bytes,
		"reflinked", cs.Cloned, "took", time.Since(t0).Round(time.Millisecond))
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	// Binaries are single files; the containerd and CNI release archives
	// are tarballs of a bin/ directory and of the plugins.
	if err := copyInto(root, src["kubelet"], nodeconfig.KubeletBinary); err != nil {
		return fmt.Errorf("kubelet: %w", err)
	}
	if p, ok := src["runc"]; ok {
		if err := copyInto(root, p, nodeconfig.RuncBinary); err != nil {
			return fmt.Errorf("runc: %w", err)
		}
	}
	archives := []struct{ role, dest string }{
		{"containerd", path.Dir(path.Dir(nodeconfig.ContainerdBinary))}, // bin/containerd -> /usr/local/bin
		{"cni_plugins", nodeconfig.CNIBinDir},
	}
	for _, a := range archives {
		p, ok := src[a.role]
		if !ok {
			continue
		}
		dest, err := realDir(root, dir, a.dest)
		if err != nil {
			return fmt.Errorf("%s: %w", a.role, err)
		}
		// Release archives carry their build machine's owners: not ours.
		if err := unpackFile(ctx, p, dest, unpack.Options{Log: b.log, IgnoreOwner: true}); err != nil {
			return fmt.Errorf("%s: %w", a.role, err)
		}
	}
	data, err := json.MarshalIndent(stamp, "", "  ")
	if err != nil {
		return err
	}
	if _, err := nodeconfig.WriteFiles(dir, []nodeconfig.File{{Path: "/" + stampPath, Data: append(data, '\n'), Mode: 0o644}}); err != nil {
		return err
	}
	return nil
}

func unpackFile(ctx context.Context, src, dest string, opts unpack.Options) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	return unpack.Tar(ctx, bufio.NewReaderSize(f, 1<<20), dest, opts)
}

// checkOurs refuses to replace or remove a slot directory kubeslot did not
// make: one with neither a stamp nor a journal entry.
func (b *Backend) checkOurs(slot, rootfs string, stamped bool) error {
	if stamped {
		return nil
	}
	if b.d.Record != nil {
		if _, found := b.d.Record.Lookup(ownership.KindMachineRootfs, rootfsPath(slot)); found {
			return nil
		}
	}
	return fmt.Errorf("%s exists but was not made by kubeslot (no provisioning stamp, no journal entry): move it away or pick other slot names", rootfs)
}

// checkStopped errors when slot's node runs or is starting or stopping.
func (b *Backend) checkStopped(ctx context.Context, slot string) error {
	active, sub, err := b.d.Systemd.UnitState(ctx, unitName(slot))
	if err != nil {
		return err
	}
	switch active {
	case "inactive", "failed", "":
	default:
		return fmt.Errorf("its node is running (%s is %s/%s): stop it first", unitName(slot), active, sub)
	}
	if _, err := b.d.Systemd.Machine(ctx, slot); err == nil {
		return fmt.Errorf("machine %s is still registered with machined: stop it first", slot)
	} else if !isNoMachine(err) {
		return err
	}
	return nil
}

// journal records a host change before it is made (DESIGN.md, rule 5). An
// entry already there is kept: its prior is the state before kubeslot.
func (b *Backend) journal(kind ownership.Kind, hostPath string) error {
	if b.d.Record == nil {
		return fmt.Errorf("no ownership record to journal %s %s in before changing it", kind, hostPath)
	}
	if _, found := b.d.Record.Lookup(kind, hostPath); found {
		return nil
	}
	prior, err := ownership.CapturePrior(b.root, hostPath)
	if err != nil {
		return err
	}
	return b.d.Record.Record(b.root, ownership.Change{Kind: kind, Path: hostPath, Prior: prior})
}

// journalName journals a named host change of kind (a link) once, before it
// is made; nothing was there before kubeslot.
func (b *Backend) journalName(kind ownership.Kind, name string) error {
	if b.d.Record == nil {
		return fmt.Errorf("no ownership record to journal %s %s in before changing it", kind, name)
	}
	if _, found := b.d.Record.Lookup(kind, name); found {
		return nil
	}
	return b.d.Record.Record(b.root, ownership.Change{Kind: kind, Name: name, Prior: ownership.Prior{State: ownership.PriorAbsent}})
}

// ensureDir creates the host directory p (and missing parents), each
// journalled before it is made; mode applies to the directories created.
func (b *Backend) ensureDir(p string, mode fs.FileMode) error {
	local, err := b.local(p)
	if err != nil {
		return err
	}
	if fi, err := os.Stat(local); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s: not a directory", local)
		}
		return nil
	}
	if parent := path.Dir(p); parent != "/" {
		if err := b.ensureDir(parent, 0o755); err != nil {
			return err
		}
	}
	if err := b.journal(ownership.KindDir, p); err != nil {
		return err
	}
	if err := os.Mkdir(local, mode); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if err := os.Chmod(local, mode); err != nil {
		return err
	}
	return atomicfile.SyncDir(filepath.Dir(local))
}

// removeTree removes a local directory tree (absent is fine), refusing one
// with a mount point inside: RemoveAll would delete the mounted files.
func removeTree(local string) error {
	if _, err := os.Lstat(local); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	mounts, err := mountinfo.Under(local)
	if err != nil {
		return err
	}
	if len(mounts) > 0 {
		return fmt.Errorf("%s: mount points inside (%s): refusing to remove it", local, strings.Join(mounts, ", "))
	}
	if err := os.RemoveAll(local); err != nil {
		return fmt.Errorf("remove %s: %w", local, err)
	}
	return atomicfile.SyncDir(filepath.Dir(local))
}

// Remove deletes slot's rootfs (unmounted first when layered), its layers,
// staging trees, nspawn settings and unit drop-in; what is absent is fine.
// A layered slot's mount unit stays: the slot's next build writes the same
// bytes and needs no daemon-reload (a reset removes it; started without
// layers, it fails, and so would the node). It refuses while the slot's
// node runs, and refuses a rootfs kubeslot did not make.
//
// Removing the drop-in needs no daemon-reload either: the unit is stopped,
// and whatever starts it next writes its drop-in again and reloads
// (Configure); a reset reloads at its end. Until then systemd keeps the old
// copy in memory, which starts nothing. The reload is left out because a
// repave's clean runs while the new node starts its pods, and a reload
// costs PID 1 about half a second of CPU (DESIGN.md, "Warm standby").
func (b *Backend) Remove(ctx context.Context, slot string) error {
	if err := b.checkSlot(slot); err != nil {
		return err
	}
	if err := b.checkStopped(ctx, slot); err != nil {
		return fmt.Errorf("remove slot %s: %w", slot, err)
	}
	rootfs, err := b.slotDir(rootfsPath(slot))
	if err != nil {
		return err
	}
	if _, err := os.Lstat(rootfs); err == nil {
		_, stamped, err := b.slotStamp(slot)
		if err != nil {
			stamped = true // a damaged stamp is still ours
		}
		if err := b.checkOurs(slot, rootfs, stamped); err != nil {
			return fmt.Errorf("remove slot %s: %w", slot, err)
		}
	}
	if err := b.teardown(ctx, slot); err != nil {
		return fmt.Errorf("remove slot %s: %w", slot, err)
	}
	if err := b.removeFile(settingsPath(slot)); err != nil {
		return fmt.Errorf("remove slot %s: %w", slot, err)
	}
	if err := b.removeFile(dropInPath(slot)); err != nil {
		return fmt.Errorf("remove slot %s: %w", slot, err)
	}
	if dir, err := b.root.Entry(dropInDir(slot)); err == nil {
		_ = os.Remove(dir) // only when empty: someone else's drop-in stays
	}
	if err := b.d.Systemd.ResetFailed(ctx, unitName(slot)); err != nil {
		b.log.Warn("could not reset the failed state of the node unit", "unit", unitName(slot), "err", err)
	}
	b.log.Info("slot removed", "slot", slot)
	return nil
}

// removeFile removes hostPath's directory entry: a link there is removed
// itself, what it names is never touched.
func (b *Backend) removeFile(hostPath string) error {
	local, err := b.localEntry(hostPath)
	if err != nil {
		return err
	}
	if err := atomicfile.Remove(local); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", local, err)
	}
	return nil
}
