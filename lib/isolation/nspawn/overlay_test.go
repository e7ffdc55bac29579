package nspawn

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// fakeMounter answers the trial mount with err, and counts the mounts.
type fakeMounter struct {
	err            error
	mounts, umount int
}

func (m *fakeMounter) Overlay(lower, upper, work, target string) error {
	if m.err != nil {
		return m.err
	}
	m.mounts++
	return nil
}
func (m *fakeMounter) Unmount(string) error { m.umount++; return nil }

func TestEscapePath(t *testing.T) {
	for in, want := range map[string]string{
		"/var/lib/machines/a":      "var-lib-machines-a",
		"/var/lib/machines/node-1": `var-lib-machines-node\x2d1`,
		"/var/lib/machines/.x":     `var-lib-machines-\x2ex`,
		"/":                        "-",
	} {
		if got := escapePath(in); got != want {
			t.Errorf("escapePath(%q) = %q, want %q", in, got, want)
		}
	}
	if !OwnsUnitPath("/etc/systemd/system/var-lib-machines-a.mount") || OwnsUnitPath("/etc/systemd/system/var-lib-foo.mount") {
		t.Error("OwnsUnitPath: the slot mount units, and only those")
	}
}

// overlayBackend is a backend of e whose trial mount answers with err.
func overlayBackend(e *env, edit func(string) string, err error) (*Backend, *fakeMounter) {
	b := e.backend(e.config(edit))
	m := &fakeMounter{err: err}
	b.mount = m
	return b, m
}

func TestProvisionOverlayLayers(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	b, m := overlayBackend(e, nil, nil)
	// A tree directory with its own mode: the artifact layer's copy of it
	// must carry it, or the node would see 0755.
	tree, err := b.cleanTree(ctx, digest(e.rootfs), filepath.Join(e.root.Prefix(), "srv/rootfs.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(tree, "usr/local"), 0o751); err != nil {
		t.Fatal(err)
	}
	if err := b.Provision(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if m.mounts != 1 || m.umount != 1 {
		t.Errorf("trial mount: %d mounts, %d unmounts, want 1 and 1", m.mounts, m.umount)
	}
	layers := filepath.Join(e.root.Prefix(), "var/lib/machines/.a.layers")
	rec, found, err := b.readLayers("a")
	if err != nil || !found || rec.Stamp.Mechanism != MechanismOverlay || rec.Stamp.RootFS != digest(e.rootfs) {
		t.Fatalf("layer record %+v found=%v err=%v", rec, found, err)
	}
	if l, _ := os.Readlink(filepath.Join(layers, "tree")); l != "/opt/kubeslot/cache/trees/"+digest(e.rootfs)+"/rootfs" {
		t.Errorf("tree link names %q", l)
	}
	arts, _ := os.Readlink(filepath.Join(layers, "artifacts"))
	artsLocal := filepath.Join(e.root.Prefix(), arts)
	if got, err := os.ReadFile(filepath.Join(artsLocal, "usr/local/bin/kubelet")); err != nil || string(got) != string(e.kubelet) {
		t.Errorf("artifact layer kubelet: %q %v", got, err)
	}
	if fi, err := os.Stat(filepath.Join(artsLocal, "usr/local")); err != nil || fi.Mode().Perm() != 0o751 {
		t.Errorf("artifact layer /usr/local: %v %v, want the tree's 0751", fi.Mode(), err)
	}
	if fi, err := os.Stat(filepath.Join(artsLocal, "usr/local/bin/kubelet")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("artifact layer kubelet mode: %v %v", fi.Mode(), err)
	}
	if got, err := os.ReadFile(filepath.Join(artsLocal, stampPath)); err != nil || !strings.Contains(string(got), `"rootfs_mechanism": "overlay"`) {
		t.Errorf("artifact layer stamp: %s %v", got, err)
	}
	unit := e.read("/etc/systemd/system/var-lib-machines-a.mount")
	for _, w := range []string{"What=overlay\n", "Where=/var/lib/machines/a\n", "Type=overlay\n",
		"Options=lowerdir=/var/lib/machines/.a.layers/artifacts:/var/lib/machines/.a.layers/tree," +
			"upperdir=/var/lib/machines/.a.layers/upper,workdir=/var/lib/machines/.a.layers/work\n"} {
		if !strings.Contains(unit, w) {
			t.Errorf("mount unit lacks %q:\n%s", w, unit)
		}
	}
	if _, found := e.rec.Lookup("unit", "/etc/systemd/system/var-lib-machines-a.mount"); !found {
		t.Error("the mount unit was not journalled")
	}
	calls := e.sd.Calls()
	if i, j := slices.Index(calls, "reload"), slices.Index(calls, "start var-lib-machines-a.mount"); i < 0 || j < i {
		t.Errorf("want a reload, then the mount started: %v", calls)
	}
	if ok, err := b.Provisioned("a"); !ok || err != nil {
		t.Errorf("Provisioned with the mount not active: %v %v", ok, err)
	}
	if mech, why, found, err := ReadMechanism(e.root, "a"); mech != MechanismOverlay || why != "" || !found || err != nil {
		t.Errorf("SlotMechanism: %q %q %v %v", mech, why, found, err)
	}

	// The node writes into the upper; a second run keeps it and only
	// makes sure the mount is active (no reload: the unit is the same).
	e.put("/var/lib/machines/.a.layers/upper/etc/node-wrote", []byte("x"))
	e.sd.ForgetCalls()
	if err := b.Provision(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if calls := e.sd.Calls(); !slices.Equal(calls, []string{"start var-lib-machines-a.mount"}) || m.mounts != 1 {
		t.Errorf("second run: calls %v, %d trial mounts", calls, m.mounts)
	}
	if !e.exists("/var/lib/machines/.a.layers/upper/etc/node-wrote") {
		t.Error("a second run lost the slot's writes")
	}

	// Other artifacts: a fresh upper (never the old one over a new
	// lower), the mount stopped before anything is removed, the same
	// unit bytes (no reload).
	e.kubelet = []byte("#!/bin/sh\necho kubelet v2\n")
	e.put("/srv/kubelet", e.kubelet)
	b2, _ := overlayBackend(e, nil, nil)
	e.sd.ForgetCalls()
	if err := b2.Provision(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if e.exists("/var/lib/machines/.a.layers/upper/etc/node-wrote") {
		t.Error("the rebuilt slot kept the old upper")
	}
	calls = e.sd.Calls()
	if calls[0] != "stop var-lib-machines-a.mount" || slices.Contains(calls, "reload") {
		t.Errorf("rebuild: calls %v, want the mount stopped first and no reload", calls)
	}
	if ok, _ := b.Provisioned("a"); ok {
		t.Error("the old configuration still counts as provisioned")
	}
	// The old artifact layer is pruned: no slot names it.
	ents, _ := os.ReadDir(filepath.Dir(artsLocal))
	if len(ents) != 1 {
		t.Errorf("artifact layers after the rebuild: %d, want 1", len(ents))
	}
}

func TestProvisionFallsBackToCopy(t *testing.T) {
	e := newEnv(t)
	b, _ := overlayBackend(e, nil, errors.New("invalid argument"))
	if err := b.Provision(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	mech, why, found, err := ReadMechanism(e.root, "a")
	if mech != MechanismCopy || !found || err != nil {
		t.Fatalf("SlotMechanism: %q %q %v %v", mech, why, found, err)
	}
	for _, w := range []string{"trial overlay mount failed", "/opt/kubeslot/cache/trees/.overlay-probe", "/var/lib/machines/.overlay-probe/upper", "invalid argument"} {
		if !strings.Contains(why, w) {
			t.Errorf("the reason %q does not name %q", why, w)
		}
	}
	if !e.exists("/var/lib/machines/a/usr/local/bin/kubelet") || e.exists("/etc/systemd/system/var-lib-machines-a.mount") ||
		e.exists("/var/lib/machines/.a.layers") || e.exists("/var/lib/machines/.overlay-probe") || e.exists("/opt/kubeslot/cache/trees/.overlay-probe") {
		t.Error("copy fallback: want a copied rootfs, no layers, no mount unit and no probe left")
	}
}

// A kill at each step of a layered build leaves what the next run heals.
func TestProvisionOverlayResumes(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	b, _ := overlayBackend(e, nil, nil)
	if err := b.Provision(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	e.put("/var/lib/machines/.a.layers/upper/etc/node-wrote", []byte("x"))
	// Killed after the layers were in place, before the unit was written.
	if err := os.Remove(filepath.Join(e.root.Prefix(), "etc/systemd/system/var-lib-machines-a.mount")); err != nil {
		t.Fatal(err)
	}
	// ... and a layers.partial of an earlier kill is there too.
	e.put("/var/lib/machines/.a.layers.partial/upper/junk", []byte("x"))
	e.sd.ForgetCalls()
	if err := b.Provision(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if !e.exists("/etc/systemd/system/var-lib-machines-a.mount") || !e.exists("/var/lib/machines/.a.layers/upper/etc/node-wrote") {
		t.Error("a layered slot whose unit is missing: want the unit written back and the upper kept")
	}
	if got := e.sd.Calls(); !slices.Equal(got, []string{"reload", "start var-lib-machines-a.mount"}) {
		t.Errorf("calls %v", got)
	}
	// Killed while the layers were staged: the partial goes, the slot is
	// built from scratch.
	if err := os.RemoveAll(filepath.Join(e.root.Prefix(), "var/lib/machines/.a.layers")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(e.root.Prefix(), "var/lib/machines/a")); err != nil {
		t.Fatal(err)
	}
	if err := b.Provision(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if e.exists("/var/lib/machines/.a.layers.partial") || !e.exists("/var/lib/machines/.a.layers/layers.json") {
		t.Error("want the partial gone and the layers complete")
	}
}

func TestRemoveLayeredSlot(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	b, _ := overlayBackend(e, nil, nil)
	if err := b.Provision(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	e.sd.ForgetCalls()
	if err := b.Remove(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/var/lib/machines/a", "/var/lib/machines/.a.layers"} {
		if e.exists(p) {
			t.Errorf("%s still there after Remove", p)
		}
	}
	if calls := e.sd.Calls(); !slices.Contains(calls, "stop var-lib-machines-a.mount") {
		t.Errorf("Remove: calls %v, want the mount stopped", calls)
	}
	// The unit stays, so the slot's next build needs no daemon-reload.
	if !e.exists("/etc/systemd/system/var-lib-machines-a.mount") {
		t.Error("Remove took the mount unit")
	}
	e.sd.ForgetCalls()
	if err := b.Provision(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if calls := e.sd.Calls(); slices.Contains(calls, "reload") || !slices.Contains(calls, "start var-lib-machines-a.mount") {
		t.Errorf("rebuild after Remove: calls %v, want the mount started without a reload", calls)
	}
}

// pruneTrees keeps every tree a slot's layers stand on: deleting a mounted
// lower empties the node's view of its rootfs.
func TestPruneTreesKeepsLayeredSlotsTrees(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	b, _ := overlayBackend(e, nil, nil)
	if err := b.Provision(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	old := digest(e.rootfs)
	e.rootfs = tarball(t, map[string]string{"etc/os-release": "ID=debian\nVERSION=2\n", "usr/local/bin/": ""})
	e.put("/srv/rootfs.tar", e.rootfs)
	b2, _ := overlayBackend(e, nil, nil)
	if err := b2.Provision(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	trees, err := e.root.Path(hostroot.CacheDir, treesDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{old, digest(e.rootfs)} {
		if _, err := os.Stat(filepath.Join(trees, d, treeRootfs)); err != nil {
			t.Errorf("tree %s: %v", d, err)
		}
	}
	// Once slot b is gone, the next new tree prunes its tree.
	if err := b.Remove(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	b2.pruneTrees(trees, digest(e.rootfs))
	if _, err := os.Stat(filepath.Join(trees, old)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("tree %s no slot names: %v", old, err)
	}
}
