package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/cli/clitest"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/testhooks"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
)

func TestCommandLine(t *testing.T) {
	clitest.CommonFlags(t, name, run)
}

func configText(t *testing.T, machine string) string {
	return testhost.Doc{Machine: machine, Tables: `[timeouts]
lock = "1s"
# preloaded: the run asks no registry for it
[node]
sandbox_image = "127.0.0.1:5000/pause:1"
preload_images = [{source = "oci://127.0.0.1:5000/pause:1", sha256 = "` + testhost.Sum + `"}]
`}.Text(t)
}

// TestInvalidConfigChangesNothing: exit 1, the field named, and the root
// prefix left exactly as it was (empty: no layout, not even the lock dir).
func TestInvalidConfigChangesNothing(t *testing.T) {
	clitest.NoBus(t)
	prefix := t.TempDir()
	cfgFile := filepath.Join(t.TempDir(), "config.toml")
	bad := strings.Replace(configText(t, "worker-1"), `version = "1.37.2"`, `version = "one"`, 1)
	if err := os.WriteFile(cfgFile, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := clitest.Call(run, "", "--root-prefix", prefix, "--config", cfgFile)
	if code != exitcode.Failure || !strings.Contains(stderr, "kubernetes.version") {
		t.Errorf("exit %d, stderr %q; want 1 naming kubernetes.version", code, stderr)
	}
	if strings.Contains(stderr, "0123456789abcdef") {
		t.Errorf("the token reached the log: %s", stderr)
	}
	ents, err := os.ReadDir(prefix)
	if err != nil || len(ents) != 0 {
		t.Errorf("root prefix not empty after an invalid config: %v %v", ents, err)
	}
	// A missing file is the same: exit 1, nothing made.
	code, _, stderr = clitest.Call(run, "", "--root-prefix", prefix, "--config", filepath.Join(prefix, "nope.toml"))
	if code != exitcode.Failure || !strings.Contains(stderr, "nope.toml") {
		t.Errorf("missing config: exit %d, stderr %q", code, stderr)
	}
	if ents, _ := os.ReadDir(prefix); len(ents) != 0 {
		t.Errorf("root prefix not empty after a missing config: %v", ents)
	}
}

// TestLockHeldDefers: another stage holds the installation lock past
// timeouts.lock, so the run exits 69 and installs nothing.
func TestLockHeldDefers(t *testing.T) {
	clitest.NoBus(t)
	prefix := t.TempDir()
	root := testkit.RootAt(t, prefix)
	lock, err := ownership.Acquire(t.Context(), root, ownership.Holder{Stage: "kubeslot-resetter"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	cfgFile := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfgFile, []byte(configText(t, "worker-1")), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := clitest.Call(run, "", "--root-prefix", prefix, "--config", cfgFile)
	if code != exitcode.Deferred || !strings.Contains(stderr, "kubeslot-resetter") {
		t.Errorf("exit %d, stderr %q; want 69 naming the holder", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(prefix, "opt")); !os.IsNotExist(err) {
		t.Errorf("deferred run created the host root: %v", err)
	}
}

func TestBadTestEnvironmentIsUsageError(t *testing.T) {
	clitest.NoBus(t)
	cfgFile := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfgFile, []byte(configText(t, "worker-1")), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBESLOT_NODE_KUBELET_PORT", "nowhere")
	code, _, stderr := clitest.Call(run, "", "--root-prefix", t.TempDir(), "--config", cfgFile)
	if code != exitcode.Usage || !strings.Contains(stderr, "KUBESLOT_NODE_KUBELET_PORT") {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
	t.Setenv("KUBESLOT_NODE_KUBELET_PORT", "")
	// The test hook: a usage error in a rig build, not read at all in a
	// production build (--preflight: nothing runs).
	t.Setenv("KUBESLOT_TEST_PAUSE_AT", "nowhere")
	code, _, stderr = clitest.Call(run, "", "--root-prefix", t.TempDir(), "--config", cfgFile, "--preflight")
	if hook := code == exitcode.Usage && strings.Contains(stderr, "KUBESLOT_TEST_PAUSE_AT"); hook != testhooks.Enabled {
		t.Errorf("test hooks %v: exit %d, stderr %q", testhooks.Enabled, code, stderr)
	}
}

// An empty root prefix or host root is refused, never taken for "/".
func TestEmptyRootRefused(t *testing.T) { clitest.EmptyRoot(t, name, run) }

// A configuration readable by others while it holds the join token has its
// mode fixed before anything else, with a warning; --preflight only warns.
func TestWorldReadableConfigFixed(t *testing.T) {
	clitest.NoBus(t)
	prefix := t.TempDir()
	root := testkit.RootAt(t, prefix)
	lock, err := ownership.Acquire(t.Context(), root, ownership.Holder{Stage: "kubeslot-resetter"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	cfgFile := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfgFile, []byte(configText(t, "worker-1")), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(cfgFile, 0o644)
	code, _, stderr := clitest.Call(run, "", "--root-prefix", prefix, "--config", cfgFile, "--preflight")
	if fi, _ := os.Stat(cfgFile); fi.Mode().Perm() != 0o644 || !strings.Contains(stderr, "readable by others") {
		t.Errorf("--preflight: exit %d, mode %v, stderr %q; want the mode kept and a warning", code, fi.Mode(), stderr)
	}
	code, _, stderr = clitest.Call(run, "", "--root-prefix", prefix, "--config", cfgFile)
	if fi, _ := os.Stat(cfgFile); fi.Mode().Perm() != 0o600 || !strings.Contains(stderr, "readable by others") || !strings.Contains(stderr, "0600") {
		t.Errorf("exit %d, mode %v, stderr %q; want mode 0600 and the fix logged", code, fi.Mode(), stderr)
	}
	if strings.Contains(stderr, "0123456789abcdef") {
		t.Errorf("the token reached the log: %s", stderr)
	}
}

// A bootstrap in a sandbox without --systemd-bus is refused before it reads
// the configuration or takes the lock; --preflight needs no systemd.
func TestSystemdRefusedUpFront(t *testing.T) {
	clitest.SystemdRefusedUpFront(t, name, run, "--config", "/nonexistent.toml")
	code, _, errs := clitest.Call(run, "", "--root-prefix", t.TempDir(), "--config", "/nonexistent.toml", "--preflight")
	if strings.Contains(errs, "--systemd-bus") {
		t.Errorf("--preflight refused for want of a bus: exit %d, %q", code, errs)
	}
}
