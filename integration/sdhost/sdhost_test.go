package sdhost

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// These run without root; the host itself is tested in package integration/host (host_test.go). Named *Host* so that
// the rig's usual `-run Host` selects them.

func TestHostScriptsDir(t *testing.T) {
	t.Setenv("KUBESLOT_RIG_SCRIPTS", "")
	dir, err := ScriptsDir() // the working directory is integration/sdhost: walks up to go.mod
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(dir, "/scripts/rig") {
		t.Errorf("ScriptsDir = %s", dir)
	}
	if _, err := os.Stat(filepath.Join(dir, "host-init.sh")); err != nil {
		t.Error(err)
	}
	t.Setenv("KUBESLOT_RIG_SCRIPTS", t.TempDir())
	if _, err := ScriptsDir(); err == nil {
		t.Error("ScriptsDir accepted a dir without host-init.sh")
	}
}

func TestHostOptionsAreChecked(t *testing.T) {
	for _, o := range []Options{
		{Name: ""},
		{Name: "Upper"},
		{Name: "has space"},
		{Name: "-lead"},
		{Name: strings.Repeat("a", 41)},
		{Name: "ok", StateDir: "relative"},
		{Name: "ok", Binds: []Bind{{Source: "/", Target: "relative"}}},
		{Name: "ok", Binds: []Bind{{Source: "/", Target: "/a/../b"}}},
		{Name: "ok", Binds: []Bind{{Source: "/does/not/exist", Target: "/x"}}},
		{Name: "ok", V1Controllers: true}, // unified: the controllers would be mounted for nobody
		{Name: "ok", V1Controllers: true, CgroupMode: "unified"},
	} {
		if _, err := Start(context.Background(), o); err == nil {
			t.Errorf("Start(%+v) accepted bad options", o)
		}
	}
}

// TestHostWriteStaysInRoot: an absolute symlink inside the host's root must resolve inside that root, never to the
// machine's path of the same name.
func TestHostWriteStaysInRoot(t *testing.T) {
	root, victim := t.TempDir(), t.TempDir()
	if err := os.Symlink(victim, filepath.Join(root, "evil")); err != nil {
		t.Fatal(err)
	}
	// Inside the root, the symlink's target is <root><victim>: give it a dir there, as a host would have.
	if err := os.MkdirAll(filepath.Join(root, victim), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeInRoot(root, "/evil/sub/f", []byte("x"), 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(victim, "sub", "f")); err == nil {
		t.Fatal("write escaped the root through an absolute symlink")
	}
	inside := filepath.Join(root, victim, "sub", "f")
	fi, err := os.Stat(inside)
	if err != nil {
		t.Fatalf("file not at %s: %v", inside, err)
	}
	if fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640", fi.Mode().Perm())
	}
	data, err := readInRoot(root, "/evil/sub/f")
	if err != nil || string(data) != "x" {
		t.Errorf("readInRoot = %q, %v", data, err)
	}
	if err := writeInRoot(root, "/../../evil/g", []byte("y"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(victim, "g")); err == nil {
		t.Fatal("write escaped the root through ..")
	}
	entries, _ := os.ReadDir(filepath.Join(root, victim, "sub"))
	if len(entries) != 1 {
		t.Errorf("temp files left next to the target: %v", entries)
	}
}
