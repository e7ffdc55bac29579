package repave

// The resetter stage for real: a host bootstrapped by its first-boot unit, with foreign files next to
// kubeslot's, is reset by hand: every kubeslot artifact goes, the foreign ones stay, no node machine runs; after a
// power cut nothing bootstraps again; a bootstrap afterwards works (reinstall on the same host). Then kill -9 at
// several steps and a re-run that finishes, and a reset through a real AgentReset operation. Every reset keeps the
// operator's configuration without its join token (checkConfigKept).
// Rig setup: integration/rig (rig.go, shared, unchanged); helpers for the reset in this file.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/reset"
	"github.com/kubeslot/kubeslot/lib/transition"
	"github.com/kubeslot/kubeslot/units"
)

// bootstrapForReset boots a rig host, adds the foreign files and bootstraps it through the first-boot unit.
func bootstrapForReset(t *testing.T, ctx context.Context, base string, persistent bool) *rig.Rig {
	t.Helper()
	r := rig.New(t, ctx, base, persistent)
	for p, c := range rig.ResetForeign {
		if err := r.H.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := r.H.Run(ctx, "systemctl", "enable", "foreign-test.service"); err != nil {
		t.Fatalf("enable the foreign unit: %v\n%s", err, out)
	}
	r.SeedCache(ctx)
	t0 := time.Now()
	if err := r.StartUnit(ctx); err != nil {
		t.Fatalf("bootstrap unit: %v", err)
	}
	rig.Timing(t, "reset rig: bootstrap to complete (artifacts cached)", time.Since(t0))
	rig.WaitNodeHeartbeat(t, ctx, r.Admin, r.Node, time.Time{}, 3*time.Minute, r.H)
	return r
}

func TestResetOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	r := bootstrapForReset(t, ctx, "rs", true)

	// --dry-run lists, changes nothing.
	before := r.Tree(ctx)
	out, err := r.H.Run(ctx, rig.ResetBinary, "--dry-run")
	if err != nil || !strings.Contains(string(out), "/etc/systemd/nspawn/a.nspawn") || strings.Contains(string(out), "foreign") ||
		!strings.Contains(string(out), "no join token in "+rig.ConfigPath) || strings.Contains(string(out), r.Token) {
		t.Errorf("dry run: %v\n%s", err, out)
	}
	if after := r.Tree(ctx); after != before {
		t.Errorf("--dry-run changed the host:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// The reset by hand.
	t0 := time.Now()
	code, text := r.ResetByHand(ctx)
	took := time.Since(t0)
	t.Logf("reset output:\n%s", rig.TailLines(text, 40))
	if code != 0 || !strings.Contains(text, "kubeslot removed from this host") {
		t.Fatalf("reset: exit %d:\n%s\n%s", code, text, rig.HostDiag(r.H))
	}
	// The bootstrap took the join token out of the configuration once the node had joined: the reset finds none.
	if !strings.Contains(text, "no join token in the configuration") || strings.Contains(text, r.Token) {
		t.Errorf("the reset's output does not say the configuration holds no join token any more, or shows the token:\n%s", text)
	}
	rig.Timing(t, "reset: bootstrapped host to nothing (target < 15 s)", took)
	r.CheckReset(ctx)
	if code, text := r.ResetByHand(ctx); code != 0 || !strings.Contains(text, "nothing to reset") {
		t.Errorf("second reset: exit %d:\n%s", code, text)
	}

	// A power cut: nothing bootstraps at the next boot.
	if err := r.H.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := r.H.Boot(ctx); err != nil {
		t.Fatalf("boot after the reset: %v", err)
	}
	time.Sleep(3 * time.Second) // give a (wrongly) enabled first-boot unit time to start
	if out, _ := r.H.Run(ctx, "systemctl", "show", "-p", "LoadState", "-p", "ActiveState", units.Bootstrap); !strings.Contains(string(out), "LoadState=not-found") {
		t.Errorf("first-boot unit after the reboot: %s", out)
	}
	r.CheckReset(ctx)

	// Reinstall on the same host: what Ignition lays down, then the first-boot unit.
	r.LayDown(ctx)
	r.SeedCache(ctx)
	t1 := time.Now()
	if err := r.StartUnit(ctx); err != nil {
		t.Fatalf("bootstrap after the reset: %v", err)
	}
	rig.WaitNodeHeartbeat(t, ctx, r.Admin, r.Node, t1, 3*time.Minute, r.H)
	rig.Timing(t, "reset: reinstall to Node Ready with a new heartbeat", time.Since(t1))
	r.CheckComplete(ctx, t1)
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
		if out, err := r.H.Run(ctx, "systemd-run", "--unit="+unit, "--collect", "--no-block",
			"--setenv="+transition.EnvPauseAt+"="+step, rig.ResetBinary, "--yes"); err != nil {
			t.Fatalf("start %s: %v\n%s", unit, err, out)
		}
		waitJournal(t, ctx, r, unit, "paused before "+step)
		if i > 0 {
			if rec, err := r.Record(); err != nil || rec.Checkpoint != "resetting" {
				t.Errorf("record while paused before %s: %+v %v", step, rec, err)
			}
		}
		if out, err := r.H.Run(ctx, "systemctl", "kill", "-s", "KILL", unit); err != nil {
			t.Fatalf("kill -9 before %s: %v\n%s", step, err, out)
		}
		t.Logf("killed the resetter before %s", step)
	}
	rig.Timing(t, fmt.Sprintf("reset: %d pause-and-kill -9 rounds, one per step", len(reset.StepNames())), time.Since(t0))
	code, text := r.ResetByHand(ctx)
	if code != 0 || !strings.Contains(text, "kubeslot removed from this host") {
		t.Fatalf("reset after the kills: exit %d:\n%s", code, text)
	}
	r.CheckReset(ctx)
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
	if out, err := r.H.Run(ctx, "sh", "-c", dropIn(runDropIn, "20-pause.conf", reset.StepStopMachines)+" && "+dropIn(etcDropIn, "10-pause.conf", reset.StepRemoveHostRoot)+
		" && systemctl daemon-reload"); err != nil {
		t.Fatalf("pause drop-ins: %v\n%s", err, out)
	}
	op := createResetOperation(t, ctx, r)
	waitJournal(t, ctx, r, units.Resetting, "paused before "+reset.StepStopMachines)
	for _, u := range []string{"kubeslot-reset.path", "kubeslot-repave.path"} {
		if out, _ := r.H.Run(ctx, "systemctl", "is-enabled", u); strings.TrimSpace(string(out)) == "enabled" {
			t.Errorf("%s still enabled while the reset is paused after stop-units", u)
		}
	}

	// Power cut: at boot only the resetting unit can resume the reset.
	t0 := time.Now()
	if err := r.H.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := r.H.Boot(ctx); err != nil {
		t.Fatalf("boot after the power cut: %v", err)
	}
	waitJournal(t, ctx, r, units.Resetting, "paused before "+reset.StepRemoveHostRoot)
	rig.Timing(t, "reset: power cut of a request-mode run to resumed at boot (up to remove-host-root)", time.Since(t0))
	if out, err := r.H.Run(ctx, "sh", "-c", "ls /etc/systemd/system | grep -x 'kubeslot-.*\\.\\(service\\|path\\)'"); err == nil &&
		strings.TrimSpace(string(out)) != units.Resetting {
		t.Errorf("unit files while paused before %s: %q, want only %s", reset.StepRemoveHostRoot, out, units.Resetting)
	}

	// kill -9 after remove-units.
	if out, err := r.H.Run(ctx, "sh", "-c", "rm -r "+etcDropIn+" && systemctl daemon-reload"); err != nil {
		t.Fatalf("remove the pause drop-in: %v\n%s", err, out)
	}
	t1 := time.Now()
	if out, err := r.H.Run(ctx, "systemctl", "kill", "-s", "KILL", units.Resetting); err != nil {
		t.Fatalf("kill -9: %v\n%s", err, out)
	}
	rsEventually(t, ctx, 3*time.Minute, "host root and resetting unit gone without a hand", func() (bool, string) {
		_, err := r.H.Run(ctx, "test", "-e", "/opt/kubeslot")
		_, uerr := r.H.Run(ctx, "test", "-e", "/etc/systemd/system/"+units.Resetting)
		out, _ := r.H.Run(ctx, "systemctl", "show", "-p", "ActiveState", "-p", "NRestarts", units.Resetting)
		return err != nil && uerr != nil && !strings.Contains(string(out), "ActiveState=activ"), string(out)
	})
	rig.Timing(t, "reset: kill -9 of the resetting unit after remove-units to host clean (systemd restart)", time.Since(t1))
	j, _ := r.H.Journal(ctx, units.Resetting)
	if strings.Count(j, "resuming an unfinished reset") < 2 {
		t.Errorf("the resetting unit did not resume the reset after the power cut and after the kill:\n%s", rig.TailLines(j, 60))
	}
	waitOperationSucceeded(t, ctx, r, op)
	r.CheckReset(ctx)
}

// waitWatcherActive waits until the watcher the bootstrap started is serving.
func waitWatcherActive(t *testing.T, ctx context.Context, r *rig.Rig) {
	t.Helper()
	rsEventually(t, ctx, 2*time.Minute, "watcher active", func() (bool, string) {
		out, _ := r.H.Run(ctx, "systemctl", "is-active", units.Watcher)
		if s := strings.TrimSpace(string(out)); s != "active" {
			j, _ := r.H.Journal(ctx, units.Watcher)
			return false, s + "\n" + rig.TailLines(j, 30)
		}
		return true, ""
	})
}

// createResetOperation creates an AgentReset operation for the rig's Machine.
func createResetOperation(t *testing.T, ctx context.Context, r *rig.Rig) string {
	t.Helper()
	op := &v1alpha1.MachineOperation{ObjectMeta: metav1.ObjectMeta{Name: "reset-" + r.Node},
		Spec: v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationAgentReset, MachineRef: &v1alpha1.MachineReference{Name: r.Node}}}
	if _, err := r.MC.CreateOperation(ctx, op); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.MC.DeleteOperation(context.Background(), op.Name) })
	return op.Name
}

// waitOperationSucceeded waits until the operation's entry for the rig's Machine is Succeeded.
func waitOperationSucceeded(t *testing.T, ctx context.Context, r *rig.Rig, name string) {
	t.Helper()
	rsEventually(t, ctx, 3*time.Minute, "operation Succeeded for the Machine", func() (bool, string) {
		got, err := r.MC.GetOperation(ctx, name)
		if err != nil {
			return false, err.Error()
		}
		if e := got.Status.Target(r.Node, r.Node); e != nil {
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
		out, _ := r.H.Run(ctx, "systemctl", "is-active", units.Watcher)
		if s := strings.TrimSpace(string(out)); s != "active" {
			j, _ := r.H.Journal(ctx, units.Watcher)
			return false, s + "\n" + rig.TailLines(j, 30)
		}
		return true, ""
	})
	op := &v1alpha1.MachineOperation{ObjectMeta: metav1.ObjectMeta{Name: "reset-" + r.Node},
		Spec: v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationAgentReset, MachineRef: &v1alpha1.MachineReference{Name: r.Node}}}
	if _, err := r.MC.CreateOperation(ctx, op); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.MC.DeleteOperation(context.Background(), op.Name) })
	t0 := time.Now()
	var phase string
	rsEventually(t, ctx, 3*time.Minute, "operation Succeeded for the Machine", func() (bool, string) {
		got, err := r.MC.GetOperation(ctx, op.Name)
		if err != nil {
			return false, err.Error()
		}
		if e := got.Status.Target(r.Node, r.Node); e != nil {
			phase = string(e.Phase)
			return phase == "Succeeded", phase + ": " + e.Message
		}
		return false, "no entry"
	})
	rsEventually(t, ctx, 2*time.Minute, "host root and resetting unit gone", func() (bool, string) {
		_, err := r.H.Run(ctx, "test", "-e", "/opt/kubeslot")
		_, uerr := r.H.Run(ctx, "test", "-e", "/etc/systemd/system/"+units.Resetting)
		out, _ := r.H.Run(ctx, "systemctl", "is-active", units.Resetting)
		return err != nil && uerr != nil && strings.TrimSpace(string(out)) != "active", string(out)
	})
	rig.Timing(t, "reset: AgentReset operation created to host clean", time.Since(t0))
	if j, _ := r.H.Journal(ctx, "kubeslot-reset.service"); !strings.Contains(j, "reset handed over") {
		t.Errorf("kubeslot-reset.service did not hand the request over:\n%s", rig.TailLines(j, 30))
	}
	j, _ := r.H.Journal(ctx, units.Resetting)
	if !strings.Contains(j, "published the reset's result") {
		t.Errorf("the resetter did not see its result published:\n%s", rig.TailLines(j, 30))
	}
	r.CheckReset(ctx)
}

// waitJournal waits (bounded) until unit's journal contains want.
func waitJournal(t *testing.T, ctx context.Context, r *rig.Rig, unit, want string) {
	t.Helper()
	var j string
	rsEventually(t, ctx, 3*time.Minute, unit+": "+want, func() (bool, string) {
		j, _ = r.H.Journal(ctx, unit)
		return strings.Contains(j, want), rig.TailLines(j, 30)
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
