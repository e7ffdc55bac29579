package integration

// The resetter stage for real: a host bootstrapped by its first-boot unit, with foreign files next to
// kubeslot's, is reset by hand: every kubeslot artifact goes, the foreign ones stay, no node machine runs; after a
// power cut nothing bootstraps again; a bootstrap afterwards works (reinstall on the same host). Then kill -9 at
// several steps and a re-run that finishes, and a reset through a real AgentReset operation. Every reset keeps the
// operator's configuration without its join token (checkConfigKept).
// Rig setup: bootstrap_rig_test.go (shared, unchanged); helpers for the reset in this file.

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/reset"
	"github.com/kubeslot/kubeslot/lib/transition"
	"github.com/kubeslot/kubeslot/units"
)

// rsBinary is the resetter from the freshly built binaries bound into the host: a reset removes the host root, and
// with it <base>/current, so a re-run after a kill cannot run from there.
const rsBinary = bsBinsPath + "/kubeslot-resetter"

// Foreign files a reset must leave alone: a .nspawn file, a unit with its enable link, a sysctl file, a drop-in of
// the node's unit, another machine's tree.
var rsForeign = map[string]string{
	"/etc/systemd/nspawn/foreign.nspawn":                    "[Exec]\nBoot=yes\n",
	"/etc/systemd/system/foreign-test.service":              "[Service]\nType=oneshot\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n",
	"/etc/sysctl.d/99-foreign-test.conf":                    "vm.swappiness = 10\n",
	"/etc/systemd/system/systemd-nspawn@b.service.d/x.conf": "[Service]\nNice=1\n",
	"/var/lib/machines/foreign/etc/os-release":              "ID=foreign\n",
}

// rsGone are the kubeslot artifacts of a bootstrapped host.
var rsGone = []string{
	"/opt/kubeslot",
	"/var/lib/machines/a",
	"/etc/systemd/nspawn/a.nspawn",
	"/etc/systemd/system/systemd-nspawn@a.service.d/kubeslot.conf",
	"/etc/systemd/system/machines.target.wants/systemd-nspawn@a.service",
	"/etc/systemd/system/multi-user.target.wants/" + units.Bootstrap,
	"/etc/systemd/system/multi-user.target.wants/" + units.Watcher,
	"/etc/systemd/system/multi-user.target.wants/kubeslot-reset.path",
	"/etc/systemd/system/" + units.Resetting,
	"/etc/systemd/system/multi-user.target.wants/" + units.Resetting,
}

// bootstrapForReset boots a rig host, adds the foreign files and bootstraps it through the first-boot unit.
func bootstrapForReset(t *testing.T, ctx context.Context, base string, persistent bool) *bsRig {
	t.Helper()
	r := newBootstrapRig(t, ctx, base, persistent)
	for p, c := range rsForeign {
		if err := r.h.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := r.h.Run(ctx, "systemctl", "enable", "foreign-test.service"); err != nil {
		t.Fatalf("enable the foreign unit: %v\n%s", err, out)
	}
	r.seedCache(ctx)
	t0 := time.Now()
	if err := r.startUnit(ctx); err != nil {
		t.Fatalf("bootstrap unit: %v", err)
	}
	rigTiming(t, "reset rig: bootstrap to complete (artifacts cached)", time.Since(t0))
	waitNodeHeartbeat(t, ctx, r.admin, r.node, time.Time{}, 3*time.Minute, r.h)
	return r
}

// resetByHand runs the resetter with --yes and the given environment; it returns the exit code and output.
func (r *bsRig) resetByHand(ctx context.Context, env ...string) (int, string) {
	r.t.Helper()
	args := append([]string{"env"}, env...)
	out, err := r.h.Run(ctx, append(args, rsBinary, "--yes")...)
	return exitCodeOf(err), string(out)
}

// checkReset: every kubeslot artifact is gone, the foreign files are intact, no node machine runs, and no kubeslot
// unit is known to systemd.
func (r *bsRig) checkReset(ctx context.Context) {
	t := r.t
	t.Helper()
	for _, p := range rsGone {
		if out, err := r.h.Run(ctx, "test", "-e", p); err == nil {
			t.Errorf("%s still there after the reset %s", p, out)
		}
	}
	for p, c := range rsForeign {
		if got, err := r.h.ReadFile(p); err != nil || string(got) != c {
			t.Errorf("foreign %s after the reset: %q %v", p, got, err)
		}
	}
	if out, err := r.h.Run(ctx, "systemctl", "is-enabled", "foreign-test.service"); err != nil || strings.TrimSpace(string(out)) != "enabled" {
		t.Errorf("foreign unit no longer enabled: %v %s", err, out)
	}
	r.checkConfigKept(ctx)
	out, _ := r.h.Run(ctx, "sh", "-c", "ls /etc/systemd/system | grep kubeslot; true")
	// The rig's own drop-in of the first-boot unit (rig.conf) is not kubeslot's: it stays.
	if s := strings.TrimSpace(string(out)); s != units.Bootstrap+".d" {
		t.Errorf("kubeslot entries left in /etc/systemd/system: %q", s)
	}
	out, _ = r.h.Run(ctx, "systemctl", "list-units", "--all", "--plain", "--no-legend", "systemd-nspawn@*", "kubeslot-*")
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[2] != "inactive" {
			t.Errorf("unit left active after the reset: %s", l)
		}
	}
	if out, err := r.h.Run(ctx, "machinectl", "list", "--no-legend"); err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("machines after the reset: %v %q", err, out)
	}
}

// checkConfigKept: the operator's configuration is still there, 0600, without the join token;
// the token's line is the bootstrap's comment (it removes the token once the node joined; the reset then finds none)
// and every other line is as layDown wrote it.
func (r *bsRig) checkConfigKept(ctx context.Context) {
	t := r.t
	t.Helper()
	got, err := r.h.ReadFile(bsConfigPath)
	if err != nil {
		t.Errorf("the operator's %s was removed: %v", bsConfigPath, err)
		return
	}
	if r.token == "" || strings.Contains(string(got), r.token) {
		t.Errorf("%s still holds the join token (or the rig has none to look for):\n%s", bsConfigPath, got)
	}
	gotLines, wantLines := strings.Split(string(got), "\n"), strings.Split(r.config("", ""), "\n")
	if len(gotLines) != len(wantLines) {
		t.Errorf("%s: %d lines after the reset, %d before:\n%s", bsConfigPath, len(gotLines), len(wantLines), got)
		return
	}
	tokenLines := 0
	for i, w := range wantLines {
		switch g := gotLines[i]; {
		case strings.HasPrefix(w, "bootstrap_token"):
			tokenLines++
			if !strings.HasPrefix(g, "# bootstrap_token removed by kubeslot-bootstrap") {
				t.Errorf("%s line %d: %q, want the bootstrap's comment in the token's place", bsConfigPath, i+1, g)
			}
		case g != w:
			t.Errorf("%s line %d changed by the reset: %q, was %q", bsConfigPath, i+1, g, w)
		}
	}
	if tokenLines != 1 {
		t.Errorf("the rig's configuration has %d bootstrap_token lines, want 1", tokenLines)
	}
	if out, err := r.h.Run(ctx, "stat", "-c", "%a %U", bsConfigPath); err != nil || strings.TrimSpace(string(out)) != "600 root" {
		t.Errorf("%s after the reset: mode and owner %q %v, want 600 root", bsConfigPath, out, err)
	}
}

func TestResetOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	r := bootstrapForReset(t, ctx, "rs", true)

	// --dry-run lists, changes nothing.
	before := r.tree(ctx)
	out, err := r.h.Run(ctx, rsBinary, "--dry-run")
	if err != nil || !strings.Contains(string(out), "/etc/systemd/nspawn/a.nspawn") || strings.Contains(string(out), "foreign") ||
		!strings.Contains(string(out), "no join token in "+bsConfigPath) || strings.Contains(string(out), r.token) {
		t.Errorf("dry run: %v\n%s", err, out)
	}
	if after := r.tree(ctx); after != before {
		t.Errorf("--dry-run changed the host:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// The reset by hand.
	t0 := time.Now()
	code, text := r.resetByHand(ctx)
	took := time.Since(t0)
	t.Logf("reset output:\n%s", tailLines(text, 40))
	if code != 0 || !strings.Contains(text, "kubeslot removed from this host") {
		t.Fatalf("reset: exit %d:\n%s\n%s", code, text, hostDiag(r.h))
	}
	// The bootstrap took the join token out of the configuration once the node had joined: the reset finds none.
	if !strings.Contains(text, "no join token in the configuration") || strings.Contains(text, r.token) {
		t.Errorf("the reset's output does not say the configuration holds no join token any more, or shows the token:\n%s", text)
	}
	rigTiming(t, "reset: bootstrapped host to nothing (target < 15 s)", took)
	r.checkReset(ctx)
	if code, text := r.resetByHand(ctx); code != 0 || !strings.Contains(text, "nothing to reset") {
		t.Errorf("second reset: exit %d:\n%s", code, text)
	}

	// A power cut: nothing bootstraps at the next boot.
	if err := r.h.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := r.h.Boot(ctx); err != nil {
		t.Fatalf("boot after the reset: %v", err)
	}
	time.Sleep(3 * time.Second) // give a (wrongly) enabled first-boot unit time to start
	if out, _ := r.h.Run(ctx, "systemctl", "show", "-p", "LoadState", "-p", "ActiveState", units.Bootstrap); !strings.Contains(string(out), "LoadState=not-found") {
		t.Errorf("first-boot unit after the reboot: %s", out)
	}
	r.checkReset(ctx)

	// Reinstall on the same host: what Ignition lays down, then the first-boot unit.
	r.layDown(ctx)
	r.seedCache(ctx)
	t1 := time.Now()
	if err := r.startUnit(ctx); err != nil {
		t.Fatalf("bootstrap after the reset: %v", err)
	}
	waitNodeHeartbeat(t, ctx, r.admin, r.node, t1, 3*time.Minute, r.h)
	rigTiming(t, "reset: reinstall to Node Ready with a new heartbeat", time.Since(t1))
	r.checkComplete(ctx, t1)
}

// TestResetKillAtSteps: kill -9 of the resetter while it waits before each step (KUBESLOT_TEST_PAUSE_AT), one
// after another on the same bootstrapped host, each run resuming the reset the kill before interrupted (one
// bootstrap pays for every step); the last run finishes it.
func TestResetKillAtSteps(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	r := bootstrapForReset(t, ctx, "rsk", false)
	t0 := time.Now()
	for i, step := range reset.StepNames() {
		unit := fmt.Sprintf("kubeslot-rs-pause-%d", i)
		if out, err := r.h.Run(ctx, "systemd-run", "--unit="+unit, "--collect", "--no-block",
			"--setenv="+transition.EnvPauseAt+"="+step, rsBinary, "--yes"); err != nil {
			t.Fatalf("start %s: %v\n%s", unit, err, out)
		}
		waitJournal(t, ctx, r, unit, "paused before "+step)
		if i > 0 {
			if rec, err := r.record(); err != nil || rec.Checkpoint != "resetting" {
				t.Errorf("record while paused before %s: %+v %v", step, rec, err)
			}
		}
		if out, err := r.h.Run(ctx, "systemctl", "kill", "-s", "KILL", unit); err != nil {
			t.Fatalf("kill -9 before %s: %v\n%s", step, err, out)
		}
		t.Logf("killed the resetter before %s", step)
	}
	rigTiming(t, fmt.Sprintf("reset: %d pause-and-kill -9 rounds, one per step", len(reset.StepNames())), time.Since(t0))
	code, text := r.resetByHand(ctx)
	if code != 0 || !strings.Contains(text, "kubeslot removed from this host") {
		t.Fatalf("reset after the kills: exit %d:\n%s", code, text)
	}
	r.checkReset(ctx)
}

// TestResetRequestSurvivesPowerCutAndKill: a reset served from an AgentReset request runs in
// kubeslot-resetting.service, which kubeslot-reset.service installs and starts; that unit and the resetter's copy it
// runs outlive every other unit file and binary of the installation. The run is cut twice and nobody finishes it by
// hand: a power cut while it waits before stop-machines (the path units are already stopped and disabled, so only the
// resetting unit, enabled for boot, resumes it), then, in the next boot, a kill -9 while it waits before
// remove-host-root, after every other kubeslot unit file is gone (before, a run killed there was never restarted and
// the host kept its host root, marked resetting, for good). systemd starts it again; the host ends clean and the
// operation Succeeded. The pauses are two drop-ins: the one in /run (before stop-machines) is read after the one in
// /etc (before remove-host-root), so its setting wins until the power cut clears /run.
func TestResetRequestSurvivesPowerCutAndKill(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	r := bootstrapForReset(t, ctx, "rsq", true)
	waitWatcherActive(t, ctx, r)
	dropIn := func(dir, name, step string) string {
		return "mkdir -p " + dir + " && printf '[Service]\\nEnvironment=" + transition.EnvPauseAt + "=" + step + "\\n' >" + dir + "/" + name
	}
	const runDropIn, etcDropIn = "/run/systemd/system/" + units.Resetting + ".d", "/etc/systemd/system/" + units.Resetting + ".d"
	if out, err := r.h.Run(ctx, "sh", "-c", dropIn(runDropIn, "20-pause.conf", reset.StepStopMachines)+" && "+dropIn(etcDropIn, "10-pause.conf", reset.StepRemoveHostRoot)+
		" && systemctl daemon-reload"); err != nil {
		t.Fatalf("pause drop-ins: %v\n%s", err, out)
	}
	op := createResetOperation(t, ctx, r)
	waitJournal(t, ctx, r, units.Resetting, "paused before "+reset.StepStopMachines)
	for _, u := range []string{"kubeslot-reset.path", "kubeslot-repave.path"} {
		if out, _ := r.h.Run(ctx, "systemctl", "is-enabled", u); strings.TrimSpace(string(out)) == "enabled" {
			t.Errorf("%s still enabled while the reset is paused after stop-units", u)
		}
	}

	// Power cut: at boot only the resetting unit can resume the reset.
	t0 := time.Now()
	if err := r.h.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := r.h.Boot(ctx); err != nil {
		t.Fatalf("boot after the power cut: %v", err)
	}
	waitJournal(t, ctx, r, units.Resetting, "paused before "+reset.StepRemoveHostRoot)
	rigTiming(t, "reset: power cut of a request-mode run to resumed at boot (up to remove-host-root)", time.Since(t0))
	if out, err := r.h.Run(ctx, "sh", "-c", "ls /etc/systemd/system | grep -x 'kubeslot-.*\\.\\(service\\|path\\)'"); err == nil &&
		strings.TrimSpace(string(out)) != units.Resetting {
		t.Errorf("unit files while paused before %s: %q, want only %s", reset.StepRemoveHostRoot, out, units.Resetting)
	}

	// kill -9 after remove-units.
	if out, err := r.h.Run(ctx, "sh", "-c", "rm -r "+etcDropIn+" && systemctl daemon-reload"); err != nil {
		t.Fatalf("remove the pause drop-in: %v\n%s", err, out)
	}
	t1 := time.Now()
	if out, err := r.h.Run(ctx, "systemctl", "kill", "-s", "KILL", units.Resetting); err != nil {
		t.Fatalf("kill -9: %v\n%s", err, out)
	}
	rsEventually(t, ctx, 3*time.Minute, "host root and resetting unit gone without a hand", func() (bool, string) {
		_, err := r.h.Run(ctx, "test", "-e", "/opt/kubeslot")
		_, uerr := r.h.Run(ctx, "test", "-e", "/etc/systemd/system/"+units.Resetting)
		out, _ := r.h.Run(ctx, "systemctl", "show", "-p", "ActiveState", "-p", "NRestarts", units.Resetting)
		return err != nil && uerr != nil && !strings.Contains(string(out), "ActiveState=activ"), string(out)
	})
	rigTiming(t, "reset: kill -9 of the resetting unit after remove-units to host clean (systemd restart)", time.Since(t1))
	j, _ := r.h.Journal(ctx, units.Resetting)
	if strings.Count(j, "resuming an unfinished reset") < 2 {
		t.Errorf("the resetting unit did not resume the reset after the power cut and after the kill:\n%s", tailLines(j, 60))
	}
	waitOperationSucceeded(t, ctx, r, op)
	r.checkReset(ctx)
}

// waitWatcherActive waits until the watcher the bootstrap started is serving.
func waitWatcherActive(t *testing.T, ctx context.Context, r *bsRig) {
	t.Helper()
	rsEventually(t, ctx, 2*time.Minute, "watcher active", func() (bool, string) {
		out, _ := r.h.Run(ctx, "systemctl", "is-active", units.Watcher)
		if s := strings.TrimSpace(string(out)); s != "active" {
			j, _ := r.h.Journal(ctx, units.Watcher)
			return false, s + "\n" + tailLines(j, 30)
		}
		return true, ""
	})
}

// createResetOperation creates an AgentReset operation for the rig's Machine.
func createResetOperation(t *testing.T, ctx context.Context, r *bsRig) string {
	t.Helper()
	op := &v1alpha1.MachineOperation{ObjectMeta: metav1.ObjectMeta{Name: "reset-" + r.node},
		Spec: v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationAgentReset, MachineRef: &v1alpha1.MachineReference{Name: r.node}}}
	if _, err := r.mc.CreateOperation(ctx, op); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.mc.DeleteOperation(context.Background(), op.Name) })
	return op.Name
}

// waitOperationSucceeded waits until the operation's entry for the rig's Machine is Succeeded.
func waitOperationSucceeded(t *testing.T, ctx context.Context, r *bsRig, name string) {
	t.Helper()
	rsEventually(t, ctx, 3*time.Minute, "operation Succeeded for the Machine", func() (bool, string) {
		got, err := r.mc.GetOperation(ctx, name)
		if err != nil {
			return false, err.Error()
		}
		if e := got.Status.Target(r.node, r.node); e != nil {
			return e.Phase == "Succeeded", string(e.Phase) + ": " + e.Message
		}
		return false, "no entry"
	})
}

// TestResetThroughOperation: an AgentReset MachineOperation; the watcher drops the request, kubeslot-reset.path
// starts the resetter, which hands it over to kubeslot-resetting.service; the operation ends Succeeded for this
// Machine, and the host is clean, the resetting unit gone too.
func TestResetThroughOperation(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	r := bootstrapForReset(t, ctx, "rso", false)
	// The watcher the bootstrap started must be serving with the node identity the bootstrap left (it registers the
	// Machine and watches operations).
	rsEventually(t, ctx, 2*time.Minute, "watcher active", func() (bool, string) {
		out, _ := r.h.Run(ctx, "systemctl", "is-active", units.Watcher)
		if s := strings.TrimSpace(string(out)); s != "active" {
			j, _ := r.h.Journal(ctx, units.Watcher)
			return false, s + "\n" + tailLines(j, 30)
		}
		return true, ""
	})
	op := &v1alpha1.MachineOperation{ObjectMeta: metav1.ObjectMeta{Name: "reset-" + r.node},
		Spec: v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationAgentReset, MachineRef: &v1alpha1.MachineReference{Name: r.node}}}
	if _, err := r.mc.CreateOperation(ctx, op); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.mc.DeleteOperation(context.Background(), op.Name) })
	t0 := time.Now()
	var phase string
	rsEventually(t, ctx, 3*time.Minute, "operation Succeeded for the Machine", func() (bool, string) {
		got, err := r.mc.GetOperation(ctx, op.Name)
		if err != nil {
			return false, err.Error()
		}
		if e := got.Status.Target(r.node, r.node); e != nil {
			phase = string(e.Phase)
			return phase == "Succeeded", phase + ": " + e.Message
		}
		return false, "no entry"
	})
	rsEventually(t, ctx, 2*time.Minute, "host root and resetting unit gone", func() (bool, string) {
		_, err := r.h.Run(ctx, "test", "-e", "/opt/kubeslot")
		_, uerr := r.h.Run(ctx, "test", "-e", "/etc/systemd/system/"+units.Resetting)
		out, _ := r.h.Run(ctx, "systemctl", "is-active", units.Resetting)
		return err != nil && uerr != nil && strings.TrimSpace(string(out)) != "active", string(out)
	})
	rigTiming(t, "reset: AgentReset operation created to host clean", time.Since(t0))
	if j, _ := r.h.Journal(ctx, "kubeslot-reset.service"); !strings.Contains(j, "reset handed over") {
		t.Errorf("kubeslot-reset.service did not hand the request over:\n%s", tailLines(j, 30))
	}
	j, _ := r.h.Journal(ctx, units.Resetting)
	if !strings.Contains(j, "published the reset's result") {
		t.Errorf("the resetter did not see its result published:\n%s", tailLines(j, 30))
	}
	r.checkReset(ctx)
}

// waitJournal waits (bounded) until unit's journal contains want.
func waitJournal(t *testing.T, ctx context.Context, r *bsRig, unit, want string) {
	t.Helper()
	var j string
	rsEventually(t, ctx, 3*time.Minute, unit+": "+want, func() (bool, string) {
		j, _ = r.h.Journal(ctx, unit)
		return strings.Contains(j, want), tailLines(j, 30)
	})
}

// rsEventually polls cond every 300 ms until it holds, failing the test after bound.
func rsEventually(t *testing.T, ctx context.Context, bound time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(bound)
	last := ""
	for time.Now().Before(deadline) && ctx.Err() == nil {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		time.Sleep(300 * time.Millisecond)
	}
	t.Fatalf("%s: not within %v (last: %s)", what, bound, last)
}

// exitCodeOf is the exit code of a command run in the host: 0, the process's code, or -1.
func exitCodeOf(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}
