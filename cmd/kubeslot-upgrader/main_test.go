package main

import (
	"os"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/cli/clitest"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/testhooks"
	"github.com/kubeslot/kubeslot/lib/upgrade"
)

func TestCommandLine(t *testing.T) {
	clitest.CommonFlags(t, name, run)
	for _, args := range [][]string{{"recover", "--help"}, {"upgrade", "--help"}} {
		if code, out, errs := clitest.Call(run, "", args...); code != exitcode.OK || !strings.Contains(out, name) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
	}
}

// TestNotInstalledDefers: on a host root with no installation both
// commands exit 69 (deferred), never 0, and leave no request state behind.
func TestNotInstalledDefers(t *testing.T) {
	clitest.NoBus(t)
	prefix := t.TempDir()
	t.Setenv("KUBESLOT_ROOT_PREFIX", prefix)
	bundle := prefix + "/b.tar.gz"
	if err := os.WriteFile(bundle, []byte("not a bundle"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--bundle", bundle}, {"recover"}} {
		code, _, errs := clitest.Call(run, "", append(args, "--lock-wait", "1s")...)
		if code != exitcode.Deferred {
			t.Errorf("%v: exit %d, want %d; stderr %q", args, code, exitcode.Deferred, errs)
		}
		if !strings.Contains(errs, "not complete") {
			t.Errorf("%v: stderr %q does not say why", args, errs)
		}
	}
	if _, err := os.Stat(prefix + "/opt/kubeslot/state/upgrade-pending.json"); err == nil {
		t.Error("a deferred run left a signal")
	}
}

// TestUsage: bad input is a usage error before the host is touched.
func TestUsage(t *testing.T) {
	cases := []clitest.UsageCase{
		{Env: map[string]string{upgrade.EnvRequest: "repave"}},
		{Args: []string{"--sha256", strings.Repeat("a", 64)}},
		{Args: []string{"--bundle", "/x.tar.gz", "--sha256", "xyz"}},
		{Args: []string{"--json"}},
		{Args: []string{"--health-window", "10s", "--health-timeout", "5s"}},
		{Args: []string{"recover", "--lock-wait", "0s"}},
		{Args: []string{"recover", "--bundle", "/x.tar.gz"}},
	}
	if testhooks.Enabled {
		cases = append(cases, clitest.UsageCase{Env: map[string]string{"KUBESLOT_TEST_PAUSE_AT": "nowhere"}})
	}
	clitest.UsageErrors(t, run, cases)
}

// An empty root prefix or host root is refused, never taken for "/".
func TestEmptyRootRefused(t *testing.T) { clitest.EmptyRoot(t, name, run) }

// An upgrade or recover in a sandbox without --systemd-bus is refused before
// it takes the lock; --preflight needs no systemd.
func TestSystemdRefusedUpFront(t *testing.T) {
	clitest.SystemdRefusedUpFront(t, name, run)
	clitest.SystemdRefusedUpFront(t, name, run, "recover")
	code, _, errs := clitest.Call(run, "", "--root-prefix", t.TempDir(), "--preflight")
	if strings.Contains(errs, "--systemd-bus") {
		t.Errorf("--preflight refused for want of a bus: exit %d, %q", code, errs)
	}
}
