package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/cli/clitest"
	"github.com/kubeslot/kubeslot/lib/exitcode"
)

func TestCommandLine(t *testing.T) {
	clitest.CommonFlags(t, name, run)
}

// TestNotInstalledDefers: on a host root with no installation the repaver
// exits 69 (deferred: the bootstrap has not finished), never 0, and leaves
// no request or state behind.
func TestNotInstalledDefers(t *testing.T) {
	clitest.NoBus(t)
	prefix := t.TempDir()
	t.Setenv("KUBESLOT_ROOT_PREFIX", prefix)
	for _, args := range [][]string{{"b"}, {"--restart"}} {
		code, _, errs := clitest.Call(run, "", append(args, "--host-root", "/opt/kubeslot", "--lock-wait", "1s")...)
		if code != exitcode.Deferred {
			t.Errorf("%v: exit %d, want %d; stderr %q", args, code, exitcode.Deferred, errs)
		}
		if !strings.Contains(errs, "not complete") {
			t.Errorf("%v: stderr %q does not say why", args, errs)
		}
	}
	if _, err := os.Stat(filepath.Join(prefix, "opt/kubeslot/state/repave.json")); err == nil {
		t.Error("a deferred run left a repave state file")
	}
}

// TestUsage: bad input is a usage error before the host is touched.
func TestUsage(t *testing.T) {
	clitest.UsageErrors(t, run, []clitest.UsageCase{
		{Env: map[string]string{envRequest: "upgrade"}},
		{Env: map[string]string{bootstrapPause: "nowhere"}},
		{Args: []string{"--restart", "--config", "/nonexistent.toml"}},
	})
}

const bootstrapPause = "KUBESLOT_TEST_PAUSE_AT"

func TestJob(t *testing.T) {
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	j, err := job(&flags{}, getenv)
	if err != nil || j.Kind != "repave" || j.Slot != "next" {
		t.Errorf("no flags, no env: %+v, %v; want repave next", j, err)
	}
	env[envSlot] = "b"
	if j, _ := job(&flags{}, getenv); j.Slot != "b" {
		t.Errorf("KUBESLOT_SLOT=b: slot %q", j.Slot)
	}
	if j, _ := job(&flags{Slot: "a"}, getenv); j.Slot != "a" {
		t.Errorf("argument a over KUBESLOT_SLOT=b: slot %q", j.Slot)
	}
	env[envRequest] = "restart"
	if j, _ := job(&flags{}, getenv); j.Kind != "restart" {
		t.Errorf("KUBESLOT_REQUEST=restart: kind %q", j.Kind)
	}
}

// An empty root prefix or host root is refused, never taken for "/".
func TestEmptyRootRefused(t *testing.T) { clitest.EmptyRoot(t, name, run) }

// A repave or restart in a sandbox without --systemd-bus is refused before
// it takes the lock.
func TestSystemdRefusedUpFront(t *testing.T) {
	clitest.SystemdRefusedUpFront(t, name, run)
	clitest.SystemdRefusedUpFront(t, name, run, "--restart")
}
