package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/cli/clitest"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/repave"
	"github.com/kubeslot/kubeslot/lib/testhooks"
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
	cases := []clitest.UsageCase{
		{Env: map[string]string{repave.EnvRequest: "upgrade"}},
		{Args: []string{"--restart", "--config", "/nonexistent.toml"}},
	}
	if testhooks.Enabled {
		cases = append(cases, clitest.UsageCase{Env: map[string]string{"KUBESLOT_TEST_PAUSE_AT": "nowhere"}})
	}
	clitest.UsageErrors(t, run, cases)
}

// An empty root prefix or host root is refused, never taken for "/".
func TestEmptyRootRefused(t *testing.T) { clitest.EmptyRoot(t, name, run) }

// A repave or restart in a sandbox without --systemd-bus is refused before
// it takes the lock.
func TestSystemdRefusedUpFront(t *testing.T) {
	clitest.SystemdRefusedUpFront(t, name, run)
	clitest.SystemdRefusedUpFront(t, name, run, "--restart")
}
