package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kubeslot/kubeslot/lib/hostroot"
)

func TestFollowsCurrent(t *testing.T) {
	prefix := t.TempDir()
	root, err := hostroot.New(prefix, "")
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(prefix, root.HostPath())
	blue := filepath.Join(base, "releases", "blue")
	if err := os.MkdirAll(blue, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(blue, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("releases/blue", filepath.Join(base, hostroot.CurrentLink)); err != nil {
		t.Fatal(err)
	}
	args := os.Args
	t.Cleanup(func() { os.Args = args })
	for _, c := range []struct {
		argv0 string
		want  bool
	}{
		{filepath.Join(base, hostroot.CurrentLink, name), true}, // as the unit starts it
		{filepath.Join(blue, name), false},                      // the release's path itself
		{"./" + name, false},                                    // by hand
	} {
		os.Args = []string{c.argv0}
		if got := startedThroughCurrent(root); got != c.want {
			t.Errorf("argv[0] %s: follows current = %v, want %v", c.argv0, got, c.want)
		}
	}
	got, err := currentBinary(root)
	if want, _ := filepath.EvalSymlinks(filepath.Join(blue, name)); err != nil || got != want {
		t.Errorf("currentBinary = %q, %v; want %s", got, err, want)
	}
}
