package hostroot

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func newRoot(t *testing.T) (*Root, string) {
	t.Helper()
	prefix := t.TempDir()
	r, err := New(prefix, "")
	if err != nil {
		t.Fatal(err)
	}
	return r, r.Prefix()
}

func TestNamedPathsResolveUnderPrefix(t *testing.T) {
	r, p := newRoot(t)
	cases := []struct {
		name string
		got  func() (string, error)
		want string
	}{
		{"base file", func() (string, error) { return r.Path(OwnershipFile) }, "/opt/kubeslot/ownership.json"},
		{"unit", func() (string, error) { return r.Unit("kubeslot-watcher.service") }, "/etc/systemd/system/kubeslot-watcher.service"},
		{"nspawn", func() (string, error) { return r.Nspawn("a.nspawn") }, "/etc/systemd/nspawn/a.nspawn"},
		{"machine", func() (string, error) { return r.Machine("b", "etc", "hostname") }, "/var/lib/machines/b/etc/hostname"},
		{"lock", r.Lock, "/run/kubeslot/install.lock"},
	}
	for _, c := range cases {
		got, err := c.got()
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if want := filepath.Join(p, c.want); got != want {
			t.Errorf("%s: got %s, want %s", c.name, got, want)
		}
	}
	if got := r.HostPath("current", "kubeslot-watcher"); got != "/opt/kubeslot/current/kubeslot-watcher" {
		t.Errorf("HostPath: %s", got)
	}
}

func TestCustomBase(t *testing.T) {
	r, err := New(t.TempDir(), "/srv/ks/")
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.Path("requests")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(r.Prefix(), "srv/ks/requests"); got != want {
		t.Errorf("got %s, want %s", got, want)
	}
	for _, bad := range []string{"relative", "/", ""} {
		if bad == "" {
			continue // "" means the default
		}
		if _, err := New(t.TempDir(), bad); err == nil {
			t.Errorf("base %q accepted", bad)
		}
	}
}

func TestNewRejectsBadPrefix(t *testing.T) {
	if _, err := New("relative/dir", ""); err == nil {
		t.Error("relative prefix accepted")
	}
	if _, err := New(filepath.Join(t.TempDir(), "missing"), ""); err == nil {
		t.Error("missing prefix accepted")
	}
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(f, ""); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("file prefix: %v", err)
	}
}

// A prefix that is a link (such as /proc/PID/root of a process in another
// mount namespace, which readlink reports as "/") is kept as given, so the
// kernel follows it; resolving it would aim every path elsewhere.
func TestPrefixLinkKeptAsGiven(t *testing.T) {
	link := filepath.Join(t.TempDir(), "hostroot")
	mustSymlink(t, "/", link) // stands for a magic link that reads as "/"
	r, err := New(link, "")
	if err != nil {
		t.Fatal(err)
	}
	if r.Prefix() != link {
		t.Fatalf("prefix %q, want %q as given", r.Prefix(), link)
	}
	got, err := r.Path(OwnershipFile)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(link, "opt/kubeslot/ownership.json"); got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestSymlinksFollowedInsidePrefix(t *testing.T) {
	r, p := newRoot(t)
	mustMkdir(t, filepath.Join(p, "data/kubeslot"))
	mustMkdir(t, filepath.Join(p, "opt"))
	// absolute target: taken relative to the prefix, as on the host
	mustSymlink(t, "/data/kubeslot", filepath.Join(p, "opt/kubeslot"))
	got, err := r.Path("state")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(p, "data/kubeslot/state"); got != want {
		t.Errorf("absolute link: got %s, want %s", got, want)
	}
	// relative target that stays inside
	mustMkdir(t, filepath.Join(p, "var/lib/real-machines"))
	mustSymlink(t, "real-machines", filepath.Join(p, "var/lib/machines"))
	got, err = r.Machine("a")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(p, "var/lib/real-machines/a"); got != want {
		t.Errorf("relative link: got %s, want %s", got, want)
	}
}

func TestSymlinkEscapingPrefixRefused(t *testing.T) {
	r, p := newRoot(t)
	mustMkdir(t, filepath.Join(p, "etc/systemd"))
	// ../../.. from /etc/systemd/system climbs above the prefix
	mustSymlink(t, "../../../outside", filepath.Join(p, "etc/systemd/system"))
	_, err := r.Unit("evil.service")
	if !errors.Is(err, ErrEscape) {
		t.Fatalf("escaping link: got %v, want ErrEscape", err)
	}
	if !strings.Contains(err.Error(), "/etc/systemd/system/evil.service") {
		t.Errorf("error does not name the path: %v", err)
	}
	// a link in the last component escaping too
	mustMkdir(t, filepath.Join(p, "opt/kubeslot"))
	mustSymlink(t, "../../../../etc/passwd", filepath.Join(p, "opt/kubeslot/ownership.json"))
	if _, err := r.Path(OwnershipFile); !errors.Is(err, ErrEscape) {
		t.Fatalf("escaping final link: got %v", err)
	}
	// a plain .. in the host path itself
	if _, err := r.Resolve("/../../etc"); !errors.Is(err, ErrEscape) {
		t.Fatalf("dotdot path: got %v", err)
	}
}

func TestSymlinkLoopRefused(t *testing.T) {
	r, p := newRoot(t)
	mustMkdir(t, filepath.Join(p, "opt"))
	mustSymlink(t, "kubeslot", filepath.Join(p, "opt/kubeslot"))
	if _, err := r.Path("x"); err == nil || !strings.Contains(err.Error(), "too many levels") {
		t.Fatalf("loop: got %v", err)
	}
}

func TestBadNamesRefused(t *testing.T) {
	r, _ := newRoot(t)
	for _, n := range []string{"", ".", "..", "a/b"} {
		if _, err := r.Machine(n); err == nil {
			t.Errorf("slot %q accepted", n)
		}
		if _, err := r.Unit(n); err == nil {
			t.Errorf("unit %q accepted", n)
		}
	}
	if _, err := r.Resolve("relative"); err == nil {
		t.Error("relative host path accepted")
	}
}

func TestEnsureLayout(t *testing.T) {
	r, p := newRoot(t)
	if _, found, err := r.ReadLayoutVersion(); err != nil || found {
		t.Fatalf("fresh root: found=%v err=%v", found, err)
	}
	for i := 0; i < 2; i++ { // idempotent
		if err := r.EnsureLayout(); err != nil {
			t.Fatal(err)
		}
	}
	v, found, err := r.ReadLayoutVersion()
	if err != nil || !found || v != LayoutVersion {
		t.Fatalf("layout version: %d %v %v", v, found, err)
	}
	fi, err := os.Stat(filepath.Join(p, "opt/kubeslot", RequestsDir))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("requests mode %v", fi.Mode().Perm())
	}
	marker := filepath.Join(p, "opt/kubeslot", LayoutFile)
	if err := os.WriteFile(marker, []byte("7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.EnsureLayout(); err == nil || !strings.Contains(err.Error(), "layout version 7") {
		t.Fatalf("newer layout: %v", err)
	}
	if err := os.WriteFile(marker, []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.ReadLayoutVersion(); err == nil || !strings.Contains(err.Error(), marker) {
		t.Fatalf("damaged marker: %v", err)
	}
}

func mustMkdir(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
}

func mustSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// An empty prefix is refused, never taken for "/".
func TestNewRejectsEmptyPrefix(t *testing.T) {
	if _, err := New("", ""); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty prefix: %v", err)
	}
}

// Files kubeslot reads are opened without following a final link and only
// when regular; a FIFO is refused at once instead of hanging the reader, and
// reads are bounded.
func TestReadRegular(t *testing.T) {
	dir := t.TempDir()
	outside := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(outside, []byte("outside"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "good")
	os.WriteFile(good, []byte("0123456789"), 0o600)
	link := filepath.Join(dir, "link")
	os.Symlink(outside, link)
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadRegular(good, 10); err != nil || string(b) != "0123456789" {
		t.Errorf("good: %q %v", b, err)
	}
	if _, err := ReadRegular(good, 9); !errors.Is(err, ErrTooLarge) {
		t.Errorf("over the bound: %v", err)
	}
	if _, err := ReadRegular(link, 100); !errors.Is(err, ErrNotRegular) {
		t.Errorf("link: %v", err)
	}
	done := make(chan error, 1)
	go func() { _, err := ReadRegular(fifo, 100); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), "FIFO") {
			t.Errorf("fifo: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("reading a FIFO hangs")
	}
	if _, err := ReadRegular(dir, 100); !errors.Is(err, ErrNotRegular) {
		t.Errorf("directory: %v", err)
	}
	if _, err := ReadRegular(filepath.Join(dir, "missing"), 100); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing: %v", err)
	}
}

// A unit file, an nspawn settings file or a slot rootfs that is a link is
// refused by name, never resolved to what it names: kubeslot writes and
// removes these as root.
func TestUnitNspawnSlotLinksRefused(t *testing.T) {
	r, p := newRoot(t)
	outside := t.TempDir()
	for _, d := range []string{"etc/systemd/system", "etc/systemd/nspawn", "var/lib/machines"} {
		mustMkdir(t, filepath.Join(p, d))
	}
	mustSymlink(t, outside, filepath.Join(p, "etc/systemd/system/kubeslot-watcher.service"))
	mustSymlink(t, outside, filepath.Join(p, "etc/systemd/system/systemd-nspawn@a.service.d"))
	mustSymlink(t, outside, filepath.Join(p, "etc/systemd/nspawn/a.nspawn"))
	mustSymlink(t, outside, filepath.Join(p, "var/lib/machines/a"))
	for name, call := range map[string]func() (string, error){
		"/etc/systemd/system/kubeslot-watcher.service":   func() (string, error) { return r.Unit("kubeslot-watcher.service") },
		"/etc/systemd/system/systemd-nspawn@a.service.d": func() (string, error) { return r.Unit("systemd-nspawn@a.service.d") },
		"/etc/systemd/nspawn/a.nspawn":                   func() (string, error) { return r.Nspawn("a.nspawn") },
		"/var/lib/machines/a":                            func() (string, error) { return r.Machine("a") },
		"/var/lib/machines/a/etc/hostname":               func() (string, error) { return r.Machine("a", "etc", "hostname") },
	} {
		got, err := call()
		if !errors.Is(err, ErrLink) || !strings.Contains(err.Error(), strings.SplitN(name, "/etc/hostname", 2)[0]) {
			t.Errorf("%s: got %q, %v; want ErrLink naming it", name, got, err)
		}
	}
	// A link elsewhere on the way is followed as before; a missing entry is fine.
	if got, err := r.Machine("b"); err != nil || got != filepath.Join(p, "var/lib/machines/b") {
		t.Errorf("missing slot: %q, %v", got, err)
	}
}
