package release

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/buildinfo"
	"github.com/kubeslot/kubeslot/lib/bundle"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

// fakeRelease writes a directory of scripts that answer --version like the
// real binaries (exit 0), or fail for the names in broken.
func fakeRelease(t *testing.T, broken ...string) string {
	dir := t.TempDir()
	for _, name := range Binaries {
		script := "#!/bin/sh\necho " + name + " test\n"
		for _, b := range broken {
			if b == name {
				script = "#!/bin/sh\nexit 3\n"
			}
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestEnsureInstallsOnceAndLinksCurrent(t *testing.T) {
	root := testkit.Root(t)
	src := fakeRelease(t)
	if err := Usable(t.Context(), root); err == nil {
		t.Fatal("an empty root is usable")
	}
	installed, err := Ensure(t.Context(), root, src, nil)
	if err != nil || !installed {
		t.Fatalf("Ensure: %v installed=%v", err, installed)
	}
	cur := filepath.Join(root.Prefix(), "opt/kubeslot/current")
	if target, err := os.Readlink(cur); err != nil || target != "releases/blue" {
		t.Errorf("current -> %q (%v), want the relative releases/blue", target, err)
	}
	for _, name := range Binaries {
		if fi, err := os.Stat(filepath.Join(root.Prefix(), "opt/kubeslot/releases/blue", name)); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: %v", name, err)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(root.Prefix(), "opt/kubeslot/releases")); len(ents) != 1 {
		t.Errorf("releases holds %v, want blue only (no staging left)", ents)
	}
	if err := Usable(t.Context(), root); err != nil {
		t.Errorf("not usable after Ensure: %v", err)
	}
	// A usable install is left alone, even when the source is gone.
	installed, err = Ensure(t.Context(), root, filepath.Join(t.TempDir(), "gone"), nil)
	if err != nil || installed {
		t.Errorf("second Ensure: %v installed=%v, want a no-op", err, installed)
	}
}

func TestEnsureReplacesBrokenInstall(t *testing.T) {
	root := testkit.Root(t)
	if _, err := Ensure(t.Context(), root, fakeRelease(t), nil); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(root.Prefix(), "opt/kubeslot/releases/blue/kubeslot-watcher")
	if err := os.Remove(victim); err != nil {
		t.Fatal(err)
	}
	if err := Usable(t.Context(), root); err == nil || !strings.Contains(err.Error(), "kubeslot-watcher") {
		t.Errorf("Usable with a missing binary: %v", err)
	}
	installed, err := Ensure(t.Context(), root, fakeRelease(t), nil)
	if err != nil || !installed {
		t.Fatalf("repair: %v installed=%v", err, installed)
	}
	if _, err := os.Stat(victim); err != nil {
		t.Errorf("missing binary not restored: %v", err)
	}
}

func TestEnsureRefusesBrokenSource(t *testing.T) {
	root := testkit.Root(t)
	_, err := Ensure(t.Context(), root, fakeRelease(t, "kubeslot-repaver"), nil)
	if err == nil || !strings.Contains(err.Error(), "kubeslot-repaver") {
		t.Fatalf("err %v, want the broken binary named", err)
	}
	if _, err := os.Lstat(filepath.Join(root.Prefix(), "opt/kubeslot/current")); !os.IsNotExist(err) {
		t.Errorf("current made from a broken source: %v", err)
	}
}

func TestEnsureWritesACompleteRelease(t *testing.T) {
	root := testkit.Root(t)
	if _, err := Ensure(t.Context(), root, fakeRelease(t), nil); err != nil {
		t.Fatal(err)
	}
	blue := filepath.Join(root.Prefix(), "opt/kubeslot/releases/blue")
	m, err := bundle.VerifyDir(blue, buildinfo.Arch)
	if err != nil {
		t.Fatalf("blue is not a verified release: %v", err)
	}
	if m.Version != buildinfo.Version {
		t.Errorf("manifest version %q, want %q", m.Version, buildinfo.Version)
	}
	if _, err := os.Stat(filepath.Join(blue, "units", "kubeslot-watcher.service")); err != nil {
		t.Errorf("unit templates not in the release: %v", err)
	}
	if lg, err := LastGood(root); err != nil || lg != "blue" {
		t.Errorf("last-good %q (%v), want blue", lg, err)
	}
	// A release directory with a manifest (an unpacked bundle) is copied as
	// listed and verified: install it into another host root.
	other := testkit.Root(t)
	if _, err := Ensure(t.Context(), other, blue, nil); err != nil {
		t.Fatalf("install from a release directory: %v", err)
	}
	if _, err := bundle.VerifyDir(filepath.Join(other.Prefix(), "opt/kubeslot/releases/blue"), buildinfo.Arch); err != nil {
		t.Errorf("copied release: %v", err)
	}
	// A tampered source is refused.
	tampered := t.TempDir()
	if _, err := Ensure(t.Context(), testkit.RootAt(t, tampered), blue, nil); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(tampered, "opt/kubeslot/releases/blue")
	if err := os.WriteFile(filepath.Join(src, "units", "kubeslot-watcher.service"), []byte("changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Ensure(t.Context(), testkit.Root(t), src, nil); err == nil {
		t.Error("a release directory that disagrees with its manifest was installed")
	}
}

func TestLinks(t *testing.T) {
	root := testkit.Root(t)
	if _, err := Current(root); err == nil {
		t.Error("Current without a link: no error")
	}
	if _, err := Ensure(t.Context(), root, fakeRelease(t), nil); err != nil {
		t.Fatal(err)
	}
	if in, err := Inactive(root); err != nil || in != "green" {
		t.Errorf("Inactive %q (%v), want green", in, err)
	}
	if err := SetCurrent(root, "green"); err != nil {
		t.Fatal(err)
	}
	if cur, err := Current(root); err != nil || cur != "green" {
		t.Errorf("Current %q (%v), want green", cur, err)
	}
	if in, err := Inactive(root); err != nil || in != "blue" {
		t.Errorf("Inactive %q (%v), want blue", in, err)
	}
	if lg, _ := LastGood(root); lg != "blue" {
		t.Errorf("last-good moved with current: %q", lg)
	}
	if err := SetLastGood(root, "../etc"); err == nil {
		t.Error("SetLastGood accepted a name outside the release directories")
	}
	// A link to somewhere else is an error naming it, not a release.
	cur := filepath.Join(root.Prefix(), "opt/kubeslot/current")
	os.Remove(cur)
	os.Symlink("/usr/bin", cur)
	if _, err := Current(root); err == nil || !strings.Contains(err.Error(), "/usr/bin") {
		t.Errorf("Current with a foreign link: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(root.Prefix(), "opt/kubeslot")); len(ents) == 0 {
		t.Fatal("empty base")
	} else {
		for _, e := range ents {
			if strings.HasSuffix(e.Name(), ".tmp") {
				t.Errorf("temporary link left: %s", e.Name())
			}
		}
	}
}

// TestEnsureKeepsTheFallback: a release that answers
// --version too slowly (a busy host at boot) is not replaced; and when
// current is broken but last-good (blue) runs, current goes back to blue,
// which is never overwritten.
func TestEnsureKeepsTheFallback(t *testing.T) {
	root := testkit.Root(t)
	if _, err := Ensure(t.Context(), root, fakeRelease(t), nil); err != nil {
		t.Fatal(err)
	}
	blue := filepath.Join(root.Prefix(), "opt/kubeslot/releases/blue")
	marker := filepath.Join(blue, "kept")
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}

	// Slow: blue's watcher sleeps past the bound.
	defer func(d time.Duration) { versionTimeout = d }(versionTimeout)
	versionTimeout = 200 * time.Millisecond
	slow := filepath.Join(blue, "kubeslot-watcher")
	// exec: the timeout kills the sleep itself, which would otherwise hold
	// the output pipe open, and the test, for its 2 s.
	if err := os.WriteFile(slow, []byte("#!/bin/sh\nexec sleep 2\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	installed, err := Ensure(t.Context(), root, fakeRelease(t), nil)
	if !errors.Is(err, ErrSlow) || installed {
		t.Errorf("slow release: %v installed=%v, want ErrSlow and nothing replaced", err, installed)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("the slow release was replaced: %v", err)
	}
	if err := os.WriteFile(slow, []byte("#!/bin/sh\necho watcher\n"), 0o755); err != nil {
		t.Fatal(err)
	}

	// current -> a broken green, last-good -> blue: back to blue, blue kept.
	green := filepath.Join(root.Prefix(), "opt/kubeslot/releases/green")
	if err := os.MkdirAll(green, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := SetCurrent(root, "green"); err != nil {
		t.Fatal(err)
	}
	installed, err = Ensure(t.Context(), root, fakeRelease(t), nil)
	if err != nil || !installed {
		t.Fatalf("broken current: %v installed=%v", err, installed)
	}
	if cur, _ := Current(root); cur != First {
		t.Errorf("current %s, want back on %s", cur, First)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("the last good release was overwritten: %v", err)
	}
}
