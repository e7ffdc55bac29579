package main

import (
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/cli"
	"github.com/kubeslot/kubeslot/lib/cli/clitest"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/reset"
	"github.com/kubeslot/kubeslot/lib/testhooks"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
)

func TestCommandLine(t *testing.T) {
	clitest.CommonFlags(t, name, run)
}

// envRun is run with a fixed environment.
func envRun(env map[string]string) clitest.Run {
	return func(args []string, stdio cli.IO) int {
		return runEnv(args, stdio, func(k string) string { return env[k] })
	}
}

func TestNothingToReset(t *testing.T) {
	prefix := t.TempDir()
	for _, args := range [][]string{{"--yes"}, {}, {"--dry-run"}} {
		// A bus nobody listens on: with nothing to reset, systemd is never called.
		code, out, errs := clitest.Call(envRun(nil), "", append(args, "--root-prefix", prefix, "--systemd-bus", "unix:path=/nonexistent/bus")...)
		if code != exitcode.OK || !strings.Contains(out, "nothing to reset") {
			t.Errorf("%v without a record: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
	}
}

func TestUsage(t *testing.T) {
	prefix := t.TempDir()
	for _, env := range []map[string]string{{reset.EnvRequest: "repave"}, {"KUBESLOT_TEST_PAUSE_AT": "nowhere"}} {
		// The test hook is read by a rig build only: a production build
		// ignores it (and finds nothing to reset).
		want := exitcode.Usage
		if _, hook := env["KUBESLOT_TEST_PAUSE_AT"]; hook && !testhooks.Enabled {
			want = exitcode.OK
		}
		if code, _, errs := clitest.Call(envRun(env), "", "--yes", "--root-prefix", prefix, "--systemd-bus", "unix:path=/nonexistent/bus"); code != want {
			t.Errorf("env %v: exit %d, want %d: %s", env, code, want, errs)
		}
	}
}

// TestConfirmation: with an installation, a run by hand without --yes asks; anything but "yes" changes nothing.
func TestConfirmation(t *testing.T) {
	prefix := t.TempDir()
	root := testkit.RootAt(t, prefix)
	rec := testhost.Owned(t, root, "m1", "abcd")
	for _, stdin := range []string{"", "no\n", "y\n"} {
		code, out, errs := clitest.Call(envRun(nil), stdin, "--root-prefix", prefix, "--systemd-bus", "unix:path=/nonexistent/bus")
		if code != exitcode.Usage || !strings.Contains(out, "Type yes") || !strings.Contains(errs, "nothing was changed") {
			t.Errorf("stdin %q: exit %d, stdout %q, stderr %q", stdin, code, out, errs)
		}
		if got, err := ownership.Load(root); err != nil || got == nil || got.Checkpoint != rec.Checkpoint {
			t.Errorf("stdin %q: record %+v %v", stdin, got, err)
		}
	}
	code, out, _ := clitest.Call(envRun(nil), "", "--dry-run", "--root-prefix", prefix)
	if code != exitcode.OK || !strings.Contains(out, "remove-record") || !strings.Contains(out, "nothing was changed") {
		t.Errorf("--dry-run: exit %d:\n%s", code, out)
	}
}

// An empty root prefix or host root is refused, never taken for "/".
func TestEmptyRootRefused(t *testing.T) { clitest.EmptyRoot(t, name, run) }

// A reset in a sandbox without --systemd-bus is refused before the record is
// marked resetting; --dry-run needs no systemd.
func TestSystemdRefusedUpFront(t *testing.T) {
	clitest.SystemdRefusedUpFront(t, name, run, "--yes")
	code, _, errs := clitest.Call(run, "", "--root-prefix", t.TempDir(), "--dry-run")
	if strings.Contains(errs, "--systemd-bus") {
		t.Errorf("--dry-run refused for want of a bus: exit %d, %q", code, errs)
	}
}
