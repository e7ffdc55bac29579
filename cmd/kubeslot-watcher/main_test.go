package main

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/cli/clitest"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/testhooks"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
	"github.com/kubeslot/kubeslot/lib/watcher"
	"github.com/kubeslot/kubeslot/units"
)

func TestCommandLine(t *testing.T) {
	clitest.CommonFlags(t, name, run)
	if code, _, _ := clitest.Call(run, "", "--lock-wait", "soon"); code != exitcode.Usage {
		t.Errorf("--lock-wait soon: exit %d, want %d", code, exitcode.Usage)
	}
	for _, args := range [][]string{{"--rollout-lease", "1s"}, {"--rollout-poll", "0s"}} {
		if code, _, errs := clitest.Call(run, "", append([]string{"--root-prefix", t.TempDir()}, args...)...); code != exitcode.Usage || !strings.Contains(errs, args[0]) {
			t.Errorf("%v: exit %d, stderr %q; want %d naming the flag", args, code, errs, exitcode.Usage)
		}
	}
}

// TestDeferral: without a complete installation the watcher exits 69 and
// logs no error.
func TestDeferral(t *testing.T) {
	prefix := t.TempDir()
	root := testkit.RootAt(t, prefix)
	call := func() (int, string) {
		code, _, errs := clitest.Call(run, "", "--root-prefix", prefix, "--lock-wait", "2s")
		return code, errs
	}
	check := func(what string) {
		t.Helper()
		code, errs := call()
		if code != exitcode.Deferred || strings.Contains(errs, "ERROR") || !strings.Contains(errs, "deferred") {
			t.Errorf("%s: exit %d, stderr %q; want %d, a deferral line and no error", what, code, errs, exitcode.Deferred)
		}
	}
	check("no installation")

	rec := testhost.Owned(t, root, "node1", testhost.Sum)
	check("installation at " + string(rec.Checkpoint))

	// The lock held by another stage past --lock-wait is waited out, round
	// after round, never a deferral: a deferred watcher is not restarted.
	l := lockFor(t, root)
	released := make(chan struct{})
	go func() {
		time.Sleep(2500 * time.Millisecond)
		l.Release()
		close(released)
	}()
	t0 := time.Now()
	code, _, errs := clitest.Call(run, "", "--root-prefix", prefix, "--lock-wait", "1s")
	<-released
	if took := time.Since(t0); code != exitcode.Deferred || took < 2*time.Second || strings.Count(errs, "installation lock still busy; waiting on") < 2 ||
		!strings.Contains(errs, "not complete") {
		t.Errorf("lock held 2.5s, --lock-wait 1s: exit %d after %s, stderr %q; want rounds of waiting, then the deferral for the incomplete installation", code, took, errs)
	}

	// Complete, but no identity: a failure naming the file.
	for _, cp := range ownership.InstallCheckpoints()[1:] {
		if err := rec.SetCheckpoint(cp); err != nil {
			t.Fatal(err)
		}
	}
	if err := ownership.Save(root, rec); err != nil {
		t.Fatal(err)
	}
	code, errs = call()
	if code != exitcode.Failure || !strings.Contains(errs, "identity/kubeconfig") {
		t.Errorf("complete without identity: exit %d, stderr %q; want %d naming the kubeconfig", code, errs, exitcode.Failure)
	}
}

// TestTestExitAfter: the exit hook works in a rig build only; a
// production build ignores the variable (and defers: no installation).
func TestTestExitAfter(t *testing.T) {
	env := watcher.EnvTestExitAfter
	t.Setenv(env, "0s")
	code, _, errs := clitest.Call(run, "", "--root-prefix", t.TempDir(), "--lock-wait", "2s")
	switch {
	case testhooks.Enabled && (code != exitcode.Failure || !strings.Contains(errs, "WARN") || !strings.Contains(errs, env)):
		t.Errorf("%s=0s: exit %d, stderr %q; want 1 and a warning naming the variable", env, code, errs)
	case !testhooks.Enabled && (code != exitcode.Deferred || strings.Contains(errs, env)):
		t.Errorf("%s=0s in a production build: exit %d, stderr %q; want the hook ignored", env, code, errs)
	}
	t.Setenv(env, "soon")
	code, _, errs = clitest.Call(run, "", "--root-prefix", t.TempDir(), "--lock-wait", "2s")
	if hook := code == exitcode.Usage && strings.Contains(errs, env) && strings.Contains(errs, "soon"); hook != testhooks.Enabled {
		t.Errorf("%s=soon, test hooks %v: exit %d, stderr %q", env, testhooks.Enabled, code, errs)
	}
}

// An empty root prefix or host root is refused, never taken for "/".
func TestEmptyRootRefused(t *testing.T) { clitest.EmptyRoot(t, name, run) }

// TestConfigDefault: --config defaults to the file the first-boot unit
// hands the bootstrap, the operator's.
func TestConfigDefault(t *testing.T) {
	f, _ := reflect.TypeFor[flags]().FieldByName("Config")
	if got := f.Tag.Get("default"); got != units.ConfigPath {
		t.Errorf("--config default %q, want %q", got, units.ConfigPath)
	}
}
