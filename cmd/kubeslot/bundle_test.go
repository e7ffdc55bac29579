package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/bundle"
	"github.com/kubeslot/kubeslot/lib/cli/clitest"
	"github.com/kubeslot/kubeslot/lib/exitcode"
)

// fakeBins writes small shell scripts named like the kubeslot binaries.
func fakeBins(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range bundle.Binaries {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/sh\necho "+n+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// checkOutput parses `<sha256>  <path>` and checks it against the file.
func checkOutput(t *testing.T, out, wantPath string) string {
	t.Helper()
	sum, p, ok := strings.Cut(strings.TrimSuffix(out, "\n"), "  ")
	if !ok || p != wantPath || strings.Count(out, "\n") != 1 {
		t.Fatalf("stdout %q, want \"<sha256>  %s\\n\"", out, wantPath)
	}
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if s := sha256.Sum256(data); hex.EncodeToString(s[:]) != sum {
		t.Fatalf("printed sha256 %s, file has %x", sum, s)
	}
	return sum
}

func TestBundleCreate(t *testing.T) {
	dir := t.TempDir()
	bins := filepath.Join(dir, "bin")
	fakeBins(t, bins)
	out := filepath.Join(dir, "out", "k.tar.gz")
	// The repository's own unit templates, units.go and its test beside them.
	code, stdout, stderr := clitest.Call(run, "", "bundle", "create", "--bins", bins, "--units", "../../units",
		"--release-version", "v1.2.3-4-gabc", "--arch", "arm64", "--out", out)
	if code != exitcode.OK {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	sum := checkOutput(t, stdout, out)

	dest := filepath.Join(dir, "green")
	m, err := bundle.Unpack(context.Background(), out, sum, "arm64", dest, bundle.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if m.Version != "v1.2.3-4-gabc" || m.Arch != "arm64" {
		t.Errorf("manifest version %q arch %q", m.Version, m.Arch)
	}
	if _, ok := m.File("units/kubeslot-watcher.service"); !ok {
		t.Error("units/kubeslot-watcher.service is not in the bundle")
	}
	if _, ok := m.File("units/units.go"); ok {
		t.Error("units/units.go is in the bundle")
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "out", ".*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}

	// Again: the bundle is replaced, not refused.
	if code, stdout, stderr = clitest.Call(run, "", "bundle", "create", "--bins", bins, "--units", "../../units",
		"--release-version", "v1.2.4", "--arch", "arm64", "--out", out); code != exitcode.OK {
		t.Fatalf("second run: exit %d, stderr %q", code, stderr)
	}
	checkOutput(t, stdout, out)
}

func TestBundleCreateDefaults(t *testing.T) {
	dir := t.TempDir()
	fakeBins(t, filepath.Join(dir, "bin"))
	if err := os.MkdirAll(filepath.Join(dir, "units"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "units", "kubeslot-watcher.service"), []byte("[Service]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	code, stdout, stderr := clitest.Call(run, "", "bundle", "create")
	if code != exitcode.OK {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	// Tests run unstamped: buildinfo.Version is "devel".
	want := filepath.Join("dist", "kubeslot-devel-"+runtime.GOARCH+".tar.gz")
	sum := checkOutput(t, stdout, want)
	if _, err := bundle.Unpack(context.Background(), filepath.Join(dir, want), sum, runtime.GOARCH, filepath.Join(dir, "blue"), bundle.Limits{}); err != nil {
		t.Fatal(err)
	}
}

func TestBundleCreateRefuses(t *testing.T) {
	dir := t.TempDir()
	bins := filepath.Join(dir, "bin")
	fakeBins(t, bins)
	out := filepath.Join(dir, "dist", "k.tar.gz")
	for name, c := range map[string]struct {
		args     []string
		prep     func()
		wantCode int
		want     string
	}{
		"bad version":    {args: []string{"--release-version", "1 0"}, wantCode: exitcode.Usage, want: "--release-version"},
		"bad arch":       {args: []string{"--arch", "x86_64"}, wantCode: exitcode.Usage, want: "--arch"},
		"global version": {args: []string{"--version"}, wantCode: exitcode.OK, want: ""},
		"missing binary": {prep: func() { os.Remove(filepath.Join(bins, "kubeslot-repaver")) }, wantCode: exitcode.Failure, want: "kubeslot-repaver"},
		"no units":       {args: []string{"--units", filepath.Join(dir, "nounits")}, wantCode: exitcode.Failure, want: "nounits"},
	} {
		t.Run(name, func(t *testing.T) {
			if c.prep != nil {
				c.prep()
				defer fakeBins(t, bins)
			}
			args := append([]string{"bundle", "create", "--bins", bins, "--units", "../../units", "--out", out}, c.args...)
			code, stdout, stderr := clitest.Call(run, "", args...)
			if code != c.wantCode || !strings.Contains(stderr, c.want) {
				t.Errorf("exit %d, stderr %q; want exit %d naming %q", code, stderr, c.wantCode, c.want)
			}
			if c.wantCode == exitcode.OK {
				return
			}
			if stdout != "" {
				t.Errorf("stdout %q after a failure", stdout)
			}
			if left, _ := os.ReadDir(filepath.Join(dir, "dist")); len(left) != 0 {
				t.Errorf("left in dist/: %v", left)
			}
		})
	}
}
