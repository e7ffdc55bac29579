package unpack

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// rootfsTree is a small rootfs with every kind of entry Tar keeps.
func rootfsTree(t testing.TB) []byte {
	homeTime := time.Date(2019, 7, 1, 0, 0, 0, 0, time.UTC)
	return tarball(t,
		dirE("./", 0o755),
		dirE("./etc/", 0o755),
		fileE("./etc/passwd", "root:x:0:0:root:/root:/bin/bash\n"),
		dirE("./usr/", 0o755),
		dirE("./usr/bin/", 0o755),
		withMode(fileE("./usr/bin/su", "su binary"), 0o4755),
		withMode(fileE("./usr/bin/ping", "ping binary"), 0o755),
		withMode(fileE("./usr/bin/wall", "wall binary"), 0o2755),
		dirE("./tmp/", 0o1777),
		withOwner(dirE("./var/mail/", 0o2775), 0, 8), // parent ./var/ missing
		withTime(withOwner(dirE("./home/user/", 0o700), 1000, 1000), homeTime),
		withOwner(withMode(fileE("./home/user/.profile", "PATH=/usr/bin\n"), 0o600), 1000, 1000),
		symE("./bin", "usr/bin"),
		dirE("./etc/alternatives/", 0o755),
		symE("./etc/alternatives/pager", "/usr/bin/less"),
		withOwner(symE("./home/user/mine", "/etc/passwd"), 1000, 1000),
		symE("./usr/bin/rel", "../../etc/passwd"),
		linkE("./usr/bin/su2", "./usr/bin/su"),
		linkE("usr/bin/sh", "usr/bin/ping"),
		fileE("./var/lib/deep/nested/file", "deep"),
		withType(ent{name: "./dev/null", mode: 0o666}, tar.TypeChar),
		withType(ent{name: "./run-fifo", mode: 0o644}, tar.TypeFifo),
	)
}

func checkRootfsTree(t *testing.T, dest string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("ownership and setuid need root")
	}
	p := func(n string) string { return filepath.Join(dest, n) }
	for n, want := range map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/bash\n", "usr/bin/su": "su binary",
		"home/user/.profile": "PATH=/usr/bin\n", "var/lib/deep/nested/file": "deep",
	} {
		if b, err := os.ReadFile(p(n)); err != nil || string(b) != want {
			t.Errorf("%s: %q %v", n, b, err)
		}
	}
	modes := map[string]fs.FileMode{
		".": fs.ModeDir | 0o755, "usr/bin/su": fs.ModeSetuid | 0o755, "usr/bin/wall": fs.ModeSetgid | 0o755,
		"tmp": fs.ModeDir | fs.ModeSticky | 0o777, "var/mail": fs.ModeDir | fs.ModeSetgid | 0o775,
		"var": fs.ModeDir | 0o755, "var/lib/deep": fs.ModeDir | 0o755,
		"home/user": fs.ModeDir | 0o700, "home/user/.profile": 0o600,
	}
	for n, want := range modes {
		if fi, _ := lstat(t, p(n)); fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", n, fi.Mode(), want)
		}
	}
	owners := map[string][2]uint32{
		"home/user": {1000, 1000}, "home/user/.profile": {1000, 1000}, "home/user/mine": {1000, 1000},
		"var/mail": {0, 8}, "etc/passwd": {0, 0},
	}
	for n, want := range owners {
		if _, st := lstat(t, p(n)); st.Uid != want[0] || st.Gid != want[1] {
			t.Errorf("%s: owner %d:%d, want %d:%d", n, st.Uid, st.Gid, want[0], want[1])
		}
	}
	for n, want := range map[string]string{
		"bin": "usr/bin", "etc/alternatives/pager": "/usr/bin/less", "home/user/mine": "/etc/passwd",
		"usr/bin/rel": "../../etc/passwd",
	} {
		if got, err := os.Readlink(p(n)); err != nil || got != want {
			t.Errorf("%s: link %q %v, want %q", n, got, err, want)
		}
	}
	for n, orig := range map[string]string{"usr/bin/su2": "usr/bin/su", "usr/bin/sh": "usr/bin/ping"} {
		a, _ := lstat(t, p(n))
		b, _ := lstat(t, p(orig))
		if !os.SameFile(a, b) {
			t.Errorf("%s is not a hard link of %s", n, orig)
		}
	}
	if fi, _ := lstat(t, p("home/user")); !fi.ModTime().Equal(time.Date(2019, 7, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("home/user mtime %v (a child's creation overwrote it?)", fi.ModTime())
	}
	if fi, _ := lstat(t, p("etc/passwd")); !fi.ModTime().Equal(epoch) {
		t.Errorf("etc/passwd mtime %v", fi.ModTime())
	}
	for _, n := range []string{"dev/null", "run-fifo"} {
		if _, err := os.Lstat(p(n)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s created (%v); device nodes and fifos are skipped", n, err)
		}
	}
}

func TestNormalTree(t *testing.T) {
	s := newSandbox(t)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if err := Tar(context.Background(), bytes.NewReader(rootfsTree(t)), s.dest, Options{Log: log, RequireEmpty: true}); err != nil {
		t.Fatal(err)
	}
	checkRootfsTree(t, s.dest)
	for _, w := range []string{"skipped device node or FIFO", "unpacked archive", "skipped=2", "hardlinks=2"} {
		if !strings.Contains(logs.String(), w) {
			t.Errorf("log lacks %q:\n%s", w, logs.String())
		}
	}
	// Again over the result: the same tree, nothing written through the
	// links now present.
	if err := Tar(context.Background(), bytes.NewReader(rootfsTree(t)), s.dest, Options{}); err != nil {
		t.Fatalf("second run: %v", err)
	}
	checkRootfsTree(t, s.dest)
	s.checkOutside(t)
}

func TestGzip(t *testing.T) {
	s := newSandbox(t)
	if err := Tar(context.Background(), bytes.NewReader(gz(t, rootfsTree(t))), s.dest, Options{}); err != nil {
		t.Fatal(err)
	}
	checkRootfsTree(t, s.dest)
}

// zstd tarballs unpack like gzip ones (config example
// names a .tar.zst rootfs).
func TestZstd(t *testing.T) {
	s := newSandbox(t)
	var buf bytes.Buffer
	zw, err := zstd.NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	zw.Write(rootfsTree(t))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := Tar(context.Background(), bytes.NewReader(buf.Bytes()), s.dest, Options{}); err != nil {
		t.Fatal(err)
	}
	checkRootfsTree(t, s.dest)
}

func TestIgnoreOwner(t *testing.T) {
	s := newSandbox(t)
	arch := tarball(t, withOwner(fileE("f", "x"), 4242, 4343), withOwner(dirE("d/", 0o755), 4242, 4343))
	if err := Tar(context.Background(), bytes.NewReader(arch), s.dest, Options{IgnoreOwner: true}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"f", "d"} {
		if _, st := lstat(t, filepath.Join(s.dest, n)); int(st.Uid) != os.Geteuid() {
			t.Errorf("%s owned by %d", n, st.Uid)
		}
	}
}

func TestUnsafeEntriesRefused(t *testing.T) {
	cases := []struct {
		name  string
		ents  func(s sandbox) []ent
		entry string // the entry the error must name
		want  string
	}{
		{"dotdot", func(sandbox) []ent { return []ent{fileE("ok", "1"), fileE("../sentinel/x", "evil")} },
			"../sentinel/x", `".." in the path`},
		{"inner dotdot", func(sandbox) []ent { return []ent{fileE("a/../../sentinel/x", "evil")} },
			"a/../../sentinel/x", `".." in the path`},
		{"absolute", func(s sandbox) []ent { return []ent{fileE(s.sentinel+"/x", "evil")} },
			"", "absolute path"},
		{"write through archive symlink", func(s sandbox) []ent {
			return []ent{symE("link", s.sentinel), fileE("link/passwd", "evil")}
		}, "link/passwd", `"link" on the path is a symbolic link`},
		{"write through a link that stays inside", func(sandbox) []ent {
			return []ent{dirE("real/", 0o755), symE("link", "real"), fileE("link/x", "1")}
		}, "link/x", `"link" on the path is a symbolic link`},
		{"dir through archive symlink", func(s sandbox) []ent {
			return []ent{dirE("a/", 0o755), symE("a/b", s.sentinel), dirE("a/b/c/", 0o755)}
		}, "a/b/c/", `"a/b" on the path is a symbolic link`},
		{"symlink through archive symlink", func(s sandbox) []ent {
			return []ent{symE("link", s.sentinel), symE("link/x", "/etc/shadow")}
		}, "link/x", "symbolic link"},
		{"relative symlink escaping", func(sandbox) []ent { return []ent{dirE("etc/", 0o755), symE("etc/x", "../../sentinel")} },
			"etc/x", "leaves the destination"},
		{"hardlink outside", func(sandbox) []ent { return []ent{linkE("h", "../sentinel/file")} },
			"h", `".." in the path`},
		{"hardlink absolute", func(sandbox) []ent { return []ent{linkE("h", "/etc/passwd")} },
			"h", "absolute path"},
		{"hardlink through symlink", func(s sandbox) []ent {
			return []ent{symE("link", s.sentinel), linkE("h", "link/file")}
		}, "h", "symbolic link"},
		{"hardlink to missing", func(sandbox) []ent { return []ent{linkE("h", "nothing")} },
			"h", "must be an earlier entry"},
		{"non-directory named dot", func(sandbox) []ent { return []ent{fileE(".", "x")} },
			".", "names the destination itself"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newSandbox(t)
			// A file in the sentinel that a hard link or overwrite would hit.
			victim := filepath.Join(s.sentinel, "file")
			if err := os.WriteFile(victim, []byte("original"), 0o644); err != nil {
				t.Fatal(err)
			}
			ents := c.ents(s)
			entry := c.entry
			if entry == "" {
				entry = ents[len(ents)-1].name
			}
			err := Tar(context.Background(), bytes.NewReader(tarball(t, ents...)), s.dest, Options{})
			var ee *EntryError
			if !errors.As(err, &ee) || ee.Name != entry || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error on entry %q containing %q", err, entry, c.want)
			}
			if c.name != "hardlink to missing" && !errors.Is(err, ErrUnsafe) {
				t.Errorf("not ErrUnsafe: %v", err)
			}
			t.Logf("%v", err)
			s.checkOutside(t, "file")
			if b, _ := os.ReadFile(victim); string(b) != "original" {
				t.Errorf("victim changed: %q", b)
			}
			if _, st := lstat(t, victim); st.Nlink != 1 {
				t.Errorf("victim has %d links", st.Nlink)
			}
		})
	}
}

// Links already in dest (it need not be empty) are not followed either.
func TestExistingLinksInDestNotFollowed(t *testing.T) {
	s := newSandbox(t)
	victim := filepath.Join(s.sentinel, "file")
	if err := os.WriteFile(victim, []byte("original"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(s.dest, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"dir": s.sentinel, "victim": victim, "rel": "../sentinel/file"} {
		if err := os.Symlink(target, filepath.Join(s.dest, name)); err != nil {
			t.Fatal(err)
		}
	}
	// Under a pre-existing link: refused.
	err := Tar(context.Background(), bytes.NewReader(tarball(t, fileE("dir/x", "evil"))), s.dest, Options{})
	if !errors.Is(err, ErrUnsafe) {
		t.Fatalf("write under an existing link: %v", err)
	}
	// At a pre-existing link: the link is replaced, its target untouched.
	arch := tarball(t, fileE("victim", "new"), withMode(dirE("rel/", 0o700), 0o700))
	if err := Tar(context.Background(), bytes.NewReader(arch), s.dest, Options{}); err != nil {
		t.Fatal(err)
	}
	if fi, _ := lstat(t, filepath.Join(s.dest, "victim")); !fi.Mode().IsRegular() {
		t.Errorf("victim: %v", fi.Mode())
	}
	if fi, _ := lstat(t, filepath.Join(s.dest, "rel")); !fi.IsDir() {
		t.Errorf("rel: %v", fi.Mode())
	}
	if b, _ := os.ReadFile(victim); string(b) != "original" {
		t.Errorf("victim outside changed: %q", b)
	}
	if fi, _ := lstat(t, victim); fi.Mode().Perm() != 0o644 {
		t.Errorf("victim mode changed: %v", fi.Mode())
	}
	s.checkOutside(t, "file")
}

// A hard link to a symlink links the symlink, not what it points at.
func TestHardlinkToSymlinkStaysInside(t *testing.T) {
	s := newSandbox(t)
	victim := filepath.Join(s.sentinel, "file")
	if err := os.WriteFile(victim, []byte("original"), 0o644); err != nil {
		t.Fatal(err)
	}
	arch := tarball(t, symE("l", victim), linkE("h", "l"))
	if err := Tar(context.Background(), bytes.NewReader(arch), s.dest, Options{}); err != nil {
		t.Fatal(err)
	}
	if fi, _ := lstat(t, filepath.Join(s.dest, "h")); fi.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("h is %v, want a symlink", fi.Mode())
	}
	if _, st := lstat(t, victim); st.Nlink != 1 {
		t.Errorf("victim outside has %d links", st.Nlink)
	}
}

func TestBounds(t *testing.T) {
	t.Run("files", func(t *testing.T) {
		s := newSandbox(t)
		arch := tarball(t, fileE("a", "1"), fileE("b", "2"), fileE("c", "3"), fileE("d", "4"))
		err := Tar(context.Background(), bytes.NewReader(arch), s.dest, Options{MaxFiles: 3})
		var ee *EntryError
		if !errors.Is(err, ErrLimit) || !errors.As(err, &ee) || ee.Name != "d" {
			t.Fatalf("got %v", err)
		}
		if err := Tar(context.Background(), bytes.NewReader(arch), t.TempDir(), Options{MaxFiles: 4}); err != nil {
			t.Errorf("exactly MaxFiles: %v", err)
		}
	})
	t.Run("bytes", func(t *testing.T) {
		s := newSandbox(t)
		big := strings.Repeat("z", 10<<20) // a gzip bomb in miniature
		arch := gz(t, tarball(t, fileE("small", "12345"), fileE("big", big)))
		t.Logf("%d MiB of content in a %d KiB archive", len(big)>>20, len(arch)>>10)
		err := Tar(context.Background(), bytes.NewReader(arch), s.dest, Options{MaxBytes: 1 << 20})
		var ee *EntryError
		if !errors.Is(err, ErrLimit) || !errors.As(err, &ee) || ee.Name != "big" {
			t.Fatalf("got %v", err)
		}
		if _, err := os.Lstat(filepath.Join(s.dest, "big")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("over-bound file was created: %v", err)
		}
		if err := Tar(context.Background(), bytes.NewReader(arch), t.TempDir(), Options{MaxBytes: 5 + 10<<20}); err != nil {
			t.Errorf("exactly MaxBytes: %v", err)
		}
	})
}

func TestRequireEmpty(t *testing.T) {
	arch := tarball(t, fileE("a", "1"))
	s := newSandbox(t)
	// Missing dest: created.
	if err := Tar(context.Background(), bytes.NewReader(arch), s.dest, Options{RequireEmpty: true}); err != nil {
		t.Fatal(err)
	}
	// Non-empty: refused, nothing written.
	err := Tar(context.Background(), bytes.NewReader(tarball(t, fileE("b", "2"))), s.dest, Options{RequireEmpty: true})
	if err == nil || !strings.Contains(err.Error(), "not empty") || !strings.Contains(err.Error(), s.dest) {
		t.Fatalf("got %v", err)
	}
	if _, err := os.Lstat(filepath.Join(s.dest, "b")); !errors.Is(err, fs.ErrNotExist) {
		t.Error("extracted into a non-empty dest")
	}
	// Empty existing dest: fine.
	empty := filepath.Join(s.top, "sentinel")
	if err := Tar(context.Background(), bytes.NewReader(arch), empty, Options{RequireEmpty: true}); err != nil {
		t.Fatal(err)
	}
}

func TestBadArchives(t *testing.T) {
	cases := map[string]struct {
		in   []byte
		want string
	}{
		"empty input":   {nil, "archive is empty"},
		"no entries":    {tarball(t), "no entries"},
		"garbage":       {bytes.Repeat([]byte("not a tar "), 100), "read archive"},
		"bad zstd":      {[]byte{0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0}, "zstd"},
		"xz":            {[]byte{0xfd, '7', 'z', 'X', 'Z', 0, 1}, "xz-compressed"},
		"truncated":     {tarball(t, fileE("a", strings.Repeat("x", 5000)))[:1500], "read content"},
		"bad gzip":      {append(gz(t, tarball(t, fileE("a", "1")))[:30], 0, 0, 0), "unexpected EOF"},
		"relative dest": {tarball(t, fileE("a", "1")), "absolute"},
	}
	for name, c := range cases {
		dest := filepath.Join(t.TempDir(), "d")
		if name == "relative dest" {
			dest = "d"
		}
		err := Tar(context.Background(), bytes.NewReader(c.in), dest, Options{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", name, err, c.want)
		}
	}
}

func TestContextCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := Tar(ctx, bytes.NewReader(tarball(t, fileE("a", "1"))), t.TempDir(), Options{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v", err)
	}
}

// benchTree is ~200 MB in 5,000 files over 50 directories, like a rootfs.
func benchTree(b *testing.B) ([]byte, int64) {
	ents := []ent{}
	var total int64
	body := make([]byte, 40<<10)
	for i := range body {
		body[i] = byte(i * 31)
	}
	for d := 0; d < 50; d++ {
		dir := fmt.Sprintf("usr/lib/pkg%02d/", d)
		ents = append(ents, dirE(dir, 0o755))
		for f := 0; f < 100; f++ {
			ents = append(ents, withMode(fileE(fmt.Sprintf("%sfile%03d", dir, f), string(body)), 0o644))
			total += int64(len(body))
		}
	}
	return tarball(b, ents...), total
}

func BenchmarkTar(b *testing.B) {
	arch, total := benchTree(b)
	b.SetBytes(total)
	top := b.TempDir()
	// The summary line of the first run shows where the time goes.
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	n := 0
	for b.Loop() {
		n++
		dest := filepath.Join(top, fmt.Sprint(n))
		if err := Tar(context.Background(), bytes.NewReader(arch), dest, Options{RequireEmpty: true, Log: log}); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if n == 1 {
			b.Log(strings.TrimSpace(logs.String()))
		}
		if err := os.RemoveAll(dest); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(5000*float64(n)/b.Elapsed().Seconds(), "files/s")
}

func TestReplacingAndXattrs(t *testing.T) {
	s := newSandbox(t)
	// A file over a non-empty directory is an error, not a recursive delete.
	arch := tarball(t, dirE("d/", 0o755), fileE("d/x", "1"), fileE("d", "2"))
	err := Tar(context.Background(), bytes.NewReader(arch), s.dest, Options{})
	var ee *EntryError
	if !errors.As(err, &ee) || ee.Name != "d" || !strings.Contains(err.Error(), "replace existing directory") {
		t.Fatalf("got %v", err)
	}

	// A file capability (cap_net_raw, as ping has it) and a user attribute are restored after the owner is set
	// (a chown clears a capability); an SELinux label is the archive maker's, counted and not restored.
	netRaw := "\x01\x00\x00\x02\x00\x20\x00\x00" + strings.Repeat("\x00", 12) // vfs_cap_data v2, effective
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	h := &tar.Header{Name: "ping", Typeflag: tar.TypeReg, Mode: 0o755, Size: 1, Format: tar.FormatPAX,
		PAXRecords: map[string]string{"SCHILY.xattr.security.capability": netRaw, "SCHILY.xattr.user.origin": "debian",
			"SCHILY.xattr.security.selinux": "system_u:object_r:ping_exec_t:s0"}}
	if err := tw.WriteHeader(h); err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte("p"))
	tw.Close()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	dest := t.TempDir()
	if err := Tar(context.Background(), &buf, dest, Options{Log: log}); err != nil {
		t.Fatal(err)
	}
	get := func(attr string) string {
		b := make([]byte, 64)
		n, err := unix.Getxattr(filepath.Join(dest, "ping"), attr, b)
		if err != nil {
			return err.Error()
		}
		return string(b[:n])
	}
	if got := get("security.capability"); got != netRaw {
		t.Errorf("security.capability %q, want cap_net_raw", got)
	}
	if got := get("user.origin"); got != "debian" && !strings.Contains(logs.String(), "does not hold it") {
		t.Errorf("user.origin %q", got)
	}
	if !strings.Contains(logs.String(), "xattrs_not_restored=1") && !strings.Contains(logs.String(), "xattrs_not_restored=2") {
		t.Errorf("the SELinux label not counted:\n%s", logs.String())
	}
}

// A chain of relative links, each harmless on its own, that resolves
// outside the tree for any tool that follows it is refused; chains and absolute links that stay inside are kept.
func TestLinkChainsResolved(t *testing.T) {
	for name, c := range map[string]struct {
		ents []ent
		bad  string // "" when the archive is fine
	}{
		"dotdot through a link":    {[]ent{dirE("d/", 0o755), symE("d/l1", ".."), symE("l2", "d/l1/..")}, "l2"},
		"through an absolute link": {[]ent{symE("root", "/"), symE("up", "root/..")}, "up"},
		"dotdot after two links":   {[]ent{dirE("d/", 0o755), symE("d/e2", ".."), symE("d2", "d/e2/..")}, "d2"},
		"chain inside": {[]ent{dirE("usr/lib/", 0o755), fileE("usr/lib/libc.so.6", "x"), symE("lib", "usr/lib"),
			symE("usr/lib/libc.so", "../../lib/libc.so.6"), symE("abs", "/lib/libc.so")}, ""},
		"dangling": {[]ent{symE("proc-self", "/proc/self/fd"), symE("missing", "a/b/c")}, ""},
		"loop":     {[]ent{symE("a", "b"), symE("b", "a")}, ""},
		"a directory on the way replaced by a link later": {[]ent{dirE("d/", 0o755), dirE("d/e/", 0o755), symE("x", "d/e/.."), symE("d/e", "..")}, "x"},
	} {
		t.Run(name, func(t *testing.T) {
			s := newSandbox(t)
			err := Tar(context.Background(), bytes.NewReader(tarball(t, c.ents...)), s.dest, Options{})
			if c.bad == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var ee *EntryError
			if !errors.As(err, &ee) || ee.Name != c.bad || !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "leaves the destination") {
				t.Fatalf("got %v, want ErrUnsafe on entry %q", err, c.bad)
			}
		})
	}
}
