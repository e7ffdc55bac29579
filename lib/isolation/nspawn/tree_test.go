package nspawn

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/unpack"
)

// richTarball has what a real rootfs has: setuid file, read-only directory,
// hard link, symlinks, owners other than root, old times.
// netRawCap is a file capability: cap_net_raw, effective.
const netRawCap = "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"

func richTarball(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mt := time.Date(2020, 5, 1, 12, 0, 0, 0, time.UTC)
	for _, h := range []*tar.Header{
		{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "etc/os-release", Typeflag: tar.TypeReg, Mode: 0o644, Size: 10},
		{Name: "usr/bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "usr/bin/su", Typeflag: tar.TypeReg, Mode: 0o4755, Size: 10},
		{Name: "usr/bin/su2", Typeflag: tar.TypeLink, Linkname: "usr/bin/su"},
		{Name: "usr/bin/sh", Typeflag: tar.TypeSymlink, Linkname: "dash", Uid: 7, Gid: 8},
		{Name: "home/user/", Typeflag: tar.TypeDir, Mode: 0o700, Uid: 1000, Gid: 1000},
		{Name: "home/user/empty", Typeflag: tar.TypeReg, Mode: 0o600, Uid: 1000, Gid: 1000},
		{Name: "ro/", Typeflag: tar.TypeDir, Mode: 0o555},
		{Name: "ro/f", Typeflag: tar.TypeReg, Mode: 0o444, Size: 10},
		// ping's file capability, cap_net_raw (vfs_cap_data v2, effective).
		{Name: "usr/bin/ping", Typeflag: tar.TypeReg, Mode: 0o755, Size: 10,
			PAXRecords: map[string]string{"SCHILY.xattr.security.capability": netRawCap}},
	} {
		h.ModTime, h.Format = mt, tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			if _, err := tw.Write([]byte("0123456789")); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// sameTree compares two trees entry by entry: type, mode, owner, mtime,
// content, link target, and hard links kept as links.
func sameTree(t *testing.T, a, b string) {
	t.Helper()
	n := 0
	err := filepath.Walk(a, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(a, p)
		var sa, sb unix.Stat_t
		if err := unix.Lstat(p, &sa); err != nil {
			return err
		}
		if err := unix.Lstat(filepath.Join(b, rel), &sb); err != nil {
			t.Errorf("%s: missing in the copy: %v", rel, err)
			return nil
		}
		n++
		if sa.Mode != sb.Mode || sa.Uid != sb.Uid || sa.Gid != sb.Gid || sa.Nlink != sb.Nlink ||
			(sa.Size != sb.Size && sa.Mode&unix.S_IFMT != unix.S_IFDIR) { // a directory's size is its allocation

			t.Errorf("%s: mode %#o/%#o uid %d/%d gid %d/%d nlink %d/%d size %d/%d", rel, sa.Mode, sb.Mode, sa.Uid, sb.Uid,
				sa.Gid, sb.Gid, sa.Nlink, sb.Nlink, sa.Size, sb.Size)
		}
		if sa.Mtim != sb.Mtim {
			t.Errorf("%s: mtime %v, copy %v", rel, sa.Mtim, sb.Mtim)
		}
		switch sa.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			ta, _ := os.Readlink(p)
			tb, _ := os.Readlink(filepath.Join(b, rel))
			if ta != tb {
				t.Errorf("%s: link %q, copy %q", rel, ta, tb)
			}
		case unix.S_IFREG:
			da, _ := os.ReadFile(p)
			db, _ := os.ReadFile(filepath.Join(b, rel))
			if !bytes.Equal(da, db) {
				t.Errorf("%s: content differs", rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 5 {
		t.Fatalf("only %d entries compared", n)
	}
}

func TestCopyTreeKeepsEverything(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("owners are kept only by root")
	}
	e := newEnv(t)
	e.put("/srv/rich.tar", richTarball(t))
	b := e.backend(e.config(nil))
	sum := digest(richTarball(t))
	src, err := e.root.Resolve("/srv/rich.tar")
	if err != nil {
		t.Fatal(err)
	}
	tree, err := b.cleanTree(t.Context(), sum, src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "copy")
	st, err := copyTree(t.Context(), tree, dst)
	if err != nil {
		t.Fatal(err)
	}
	if st.Hardlinks != 1 || st.Symlinks != 1 || st.Files != 5 {
		t.Errorf("stats %+v, want 5 files, 1 hard link, 1 symlink", st)
	}
	for _, dir := range []string{tree, dst} {
		b := make([]byte, 64)
		n, err := unix.Getxattr(filepath.Join(dir, "usr/bin/ping"), "security.capability", b)
		if err != nil || string(b[:n]) != netRawCap {
			t.Errorf("%s: ping's file capability %q, %v", dir, b[:max(n, 0)], err)
		}
	}
	sameTree(t, tree, dst)
	if fi, err := os.Stat(filepath.Join(dst, "usr/bin/su")); err != nil || fi.Mode()&os.ModeSetuid == 0 {
		t.Errorf("setuid lost: %v %v", fi, err)
	}
	// The copy shares nothing with the tree: writing it leaves the tree clean.
	if err := os.WriteFile(filepath.Join(dst, "etc/os-release"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(filepath.Join(tree, "etc/os-release")); string(data) != "0123456789" {
		t.Errorf("the clean tree changed with its copy: %q", data)
	}
	if _, err := copyTree(t.Context(), tree, dst); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("copy onto an existing tree: %v", err)
	}
}

func TestCleanTreeBuiltOnceAndRebuiltWithoutMarker(t *testing.T) {
	e := newEnv(t)
	b := e.backend(e.config(nil))
	sum := digest(e.rootfs)
	src, _ := e.root.Resolve("/srv/rootfs.tar")
	tree, err := b.cleanTree(t.Context(), sum, src)
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(e.root.Prefix(), "opt/kubeslot/cache/trees", sum, "rootfs")
	if tree != want {
		t.Fatalf("tree at %s, want %s", tree, want)
	}
	if fi, err := os.Stat(filepath.Dir(filepath.Dir(tree))); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("trees directory: %v %v, want 0700", fi, err)
	}
	// A second call uses the tree as it is: a file added to it stays.
	sentinel := filepath.Join(tree, "sentinel")
	if err := os.WriteFile(sentinel, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := b.cleanTree(t.Context(), sum, src); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sentinel); err != nil {
		t.Errorf("a valid tree was rebuilt: %v", err)
	}
	// Without its marker (a crash between unpack and marker cannot leave
	// this, but a damaged cache can) it is not trusted: rebuilt.
	if err := os.Remove(filepath.Join(filepath.Dir(tree), treeMarker)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.cleanTree(t.Context(), sum, src); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sentinel); err == nil {
		t.Error("a tree without its marker was used")
	}
	// A staging directory left by a crash is replaced; another digest's
	// tree is pruned when a new tree is built.
	other := filepath.Join(e.root.Prefix(), "opt/kubeslot/cache/trees", strings.Repeat("0", 64))
	if err := os.MkdirAll(filepath.Join(other, "rootfs"), 0o700); err != nil {
		t.Fatal(err)
	}
	e.put("/srv/rootfs2.tar", richTarball(t))
	src2, _ := e.root.Resolve("/srv/rootfs2.tar")
	sum2 := digest(richTarball(t))
	staging := filepath.Join(e.root.Prefix(), "opt/kubeslot/cache/trees", "."+sum2+".partial")
	if err := os.MkdirAll(filepath.Join(staging, "rootfs/junk"), 0o700); err != nil {
		t.Fatal(err)
	}
	tree2, err := b.cleanTree(t.Context(), sum2, src2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(tree2, "junk")); err == nil {
		t.Error("the crashed staging tree was used")
	}
	for _, p := range []string{other, filepath.Dir(tree), staging} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s not pruned", p)
		}
	}
	if _, err := b.cleanTree(t.Context(), "../x", src2); err == nil {
		t.Error("a digest that is not hex was taken as a path")
	}
}

// TestProvisionReusesTree: the second slot is copied from the tree the
// first provision unpacked, not unpacked again.
func TestProvisionReusesTree(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(nil)
	b := e.backend(cfg)
	if err := b.Provision(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if got := e.read("/var/lib/machines/a/etc/os-release"); got != "ID=debian\n" {
		t.Fatalf("slot a os-release %q", got)
	}
	tree := "/opt/kubeslot/cache/trees/" + cfg.RootFS.SHA256
	local, _ := e.root.Resolve(tree)
	if ok, err := treeValid(local, cfg.RootFS.SHA256); !ok || err != nil {
		t.Fatalf("no valid tree after the first provision: %v", err)
	}
	// Marked in the tree only: a slot unpacked from the tarball again
	// would not have it.
	e.put(tree+"/rootfs/etc/from-tree", []byte("yes"))
	if err := b.Provision(t.Context(), "b"); err != nil {
		t.Fatal(err)
	}
	if got := e.read("/var/lib/machines/b/etc/from-tree"); got != "yes" {
		t.Errorf("slot b not copied from the cached tree: %q", got)
	}
	if e.exists(tree + "/rootfs/etc/kubeslot") {
		t.Error("provisioning wrote into the clean tree")
	}
	// With the tree there, the rootfs tarball is not read (nor hashed)
	// again: its source gone and the cached copy damaged, slot a is
	// rebuilt from the tree all the same.
	if err := b.Remove(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	cached, _ := e.root.Path(hostroot.CacheDir, "sha256", cfg.RootFS.SHA256)
	if err := os.WriteFile(cached, []byte("damaged"), 0o644); err != nil {
		t.Fatal(err)
	}
	src, _ := e.root.Resolve("/srv/rootfs.tar")
	if err := os.Remove(src); err != nil {
		t.Fatal(err)
	}
	if err := b.Provision(t.Context(), "a"); err != nil {
		t.Fatalf("slot a again, from the tree: %v", err)
	}
	if got := e.read("/var/lib/machines/a/etc/from-tree"); got != "yes" {
		t.Errorf("slot a not copied from the cached tree: %q", got)
	}
}

// TestCopyTreeBench compares copyTree with `cp -a` on a real rootfs
// tarball (KUBESLOT_TREE_BENCH=<rootfs.tar.gz>); figures are printed.
func TestCopyTreeBench(t *testing.T) {
	tarballPath := os.Getenv("KUBESLOT_TREE_BENCH")
	if tarballPath == "" {
		t.Skip("KUBESLOT_TREE_BENCH not set")
	}
	dir, err := os.MkdirTemp("/var/tmp", "treebench")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	tree := filepath.Join(dir, "tree")
	t0 := time.Now()
	if err := unpackFile(t.Context(), tarballPath, tree, unpack.Options{RequireEmpty: true}); err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE unpack: %s", time.Since(t0))
	ctx := context.Background()
	t1 := time.Now()
	st, err := copyTree(ctx, tree, filepath.Join(dir, "copy"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE copyTree: %s (%+v)", time.Since(t1), st)
	t2 := time.Now()
	if out, err := exec.Command("sh", "-c", "cp -a "+tree+" "+dir+"/cp && sync").CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v %s", err, out)
	}
	t.Logf("FIGURE cp -a: %s", time.Since(t2))
	sameTree(t, tree, filepath.Join(dir, "copy"))
}
