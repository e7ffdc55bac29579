package repave

// The repaver on the rig: a bootstrapped host with a real kubelet is repaved onto slot b by a request
// with a changed desired configuration (through kubeslot-repave.path), restarted in place by a restart request,
// refused a target whose kubelet exits at once (rollback to the old slot), and resumed after kill -9 of the
// repaver in the switch and verify phases. Figures are printed, never asserted. Helpers: integration/rig (repave_rig.go).

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/integration/sdhost"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/drain"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/transition"
)

func TestRepaveOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 18*time.Minute)
	defer cancel()
	r := rig.NewRepaveRig(t, ctx, "rp", false)
	slot, applied := r.Active()
	if slot != "a" {
		t.Fatalf("bootstrap left active slot %q", slot)
	}

	// 1. A repave request with a new node label, as the watcher drops it; kubeslot-repave.path fires.
	desired := applied.Config
	desired.Kubernetes.Labels["kubeslot.dev/repaved"] = "yes"
	req := &requests.Request{Kind: requests.Repave, ID: requests.NewID(requests.Repave, 2, ""), MachineGeneration: 2,
		Reason: "rig: new label", Desired: desired}
	t0 := time.Now()
	r.Drop(ctx, req)
	s := r.WaitStatus(ctx, req.ID, 6*time.Minute)
	whole := time.Since(t0)
	r.LogStatus("repave a->b", s)
	rig.Timing(t, "repave a->b: request dropped -> status Succeeded (path unit included)", whole)
	if s.Phase != requests.Succeeded || s.ActiveSlot != "b" {
		t.Fatalf("repave status %+v", s)
	}
	n := rig.WaitNodeHeartbeat(t, ctx, r.Admin, r.Node, t0, 2*time.Minute, r.H)
	// The kubelet sets --node-labels only when it registers a Node, and a repave keeps the Node: the repaver
	// patches the labels after commit, as the node.
	if got := n.Labels["kubeslot.dev/repaved"]; got != "yes" {
		t.Errorf("Node %s label kubeslot.dev/repaved=%q after the repave, want yes (labels %v)", r.Node, got, n.Labels)
	}
	// Drained before the switch with the node's own identity (no pods here: the cordon and the list), and
	// uncordoned after commit.
	if s.Drain == nil || s.Drain.Outcome != drain.Drained || n.Spec.Unschedulable || n.Annotations[drain.Annotation] != "" {
		t.Errorf("drain %+v; Node unschedulable %v, annotation %q after the repave", s.Drain, n.Spec.Unschedulable, n.Annotations[drain.Annotation])
	}
	slot, applied = r.Active()
	if slot != "b" || applied.Config.Kubernetes.Labels["kubeslot.dev/repaved"] != "yes" {
		t.Errorf("after the repave: active %s, labels %v", slot, applied.Config.Kubernetes.Labels)
	}
	for _, p := range []string{"/var/lib/machines/a", "/opt/kubeslot/applied/a.json", "/opt/kubeslot/state/repave.json",
		"/opt/kubeslot/state/claimed-repave.json", "/etc/systemd/system/machines.target.wants/systemd-nspawn@a.service"} {
		if out, err := r.H.Run(ctx, "test", "!", "-e", p); err != nil {
			t.Errorf("%s still there after the repave: %v %s", p, err, out)
		}
	}
	if out, err := r.H.Run(ctx, "systemctl", "is-enabled", "systemd-nspawn@b.service"); err != nil || strings.TrimSpace(string(out)) != "enabled" {
		t.Errorf("systemd-nspawn@b not enabled at boot: %v %s", err, out)
	}
	if out, err := r.H.Run(ctx, "/opt/kubeslot/current/kubeslot", "status"); err != nil || !strings.Contains(string(out), "b (nspawn mode") {
		t.Errorf("kubeslot status does not show slot b: %v\n%s", err, out)
	} else if !regexp.MustCompile(`Slot b rootfs: +overlay\n`).Match(out) {
		// The rig's /var/lib/machines is on its disk tmpfs: the fast path works there.
		t.Errorf("slot b is not a layered slot:\n%s", out)
	}
	// The fast path: our preparation (unpack from the verified cache) against a plain full copy of the rootfs.
	prep := r.Phase(s, "prepare")
	c0 := time.Now()
	if out, err := r.H.Run(ctx, "sh", "-c", "cp -a /var/lib/machines/b /var/lib/machines/.copytest && sync"); err != nil {
		t.Errorf("cp -a: %v %s", err, out)
	}
	cp := time.Since(c0)
	_, _ = r.H.Run(ctx, "rm", "-rf", "/var/lib/machines/.copytest")
	du, _ := r.H.Run(ctx, "du", "-sh", "/var/lib/machines/b")
	rig.Timing(t, "repave: target slot prepared from the cache (prepare phase)", prep)
	rig.Timing(t, "repave: cp -a of the same rootfs", cp)
	t.Logf("FIGURE repave: prepare / cp -a = %.2f (rootfs %s)", float64(prep)/float64(cp), strings.Fields(string(du) + " ?")[0])

	// 2. Restart in place through the restart request and kubeslot-restart.path.
	rreq := &requests.Request{Kind: requests.Restart, ID: requests.NewID(requests.Restart, 2, "rig-restart"), MachineGeneration: 2,
		Operation: "rig-restart", Reason: "rig"}
	t1 := time.Now()
	r.Drop(ctx, rreq)
	s = r.WaitStatus(ctx, rreq.ID, 4*time.Minute)
	r.LogStatus("restart in place", s)
	if s.Phase != requests.Succeeded || s.ActiveSlot != "b" {
		t.Errorf("restart status %+v", s)
	}
	rig.WaitNodeHeartbeat(t, ctx, r.Admin, r.Node, t1, 2*time.Minute, r.H)

	// 2a. The floor of a warm standby on this machine: the kubelet alone stopped and started in the
	// serving node, three times (the bench takes the median).
	for range 3 {
		rig.Timing(t, "floor: kubelet stop + start in the serving node (containerd, machine untouched) -> Node Ready", r.KubeletRestartFloor(ctx, "b"))
	}

	// 2b. A restart worker killed after it claimed its request: kubeslot-restart.path watches the claimed file too,
	// and the worker resumes the claimed request. The worker pauses after its claim (test hook),
	// so the kill lands there every time; the path unit is stopped meanwhile, so the checks are not raced.
	pauseDropIn := "/etc/systemd/system/kubeslot-restart.service.d/zz-pause.conf"
	if err := r.H.WriteFile(pauseDropIn, []byte("[Service]\nEnvironment=KUBESLOT_TEST_PAUSE_AT=restart-node\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := r.H.Run(ctx, "systemctl", "daemon-reload"); err != nil {
		t.Fatalf("daemon-reload: %v %s", err, out)
	}
	kreq := &requests.Request{Kind: requests.Restart, ID: requests.NewID(requests.Restart, 2, "rig-restart-killed"), MachineGeneration: 2,
		Operation: "rig-restart-killed", Reason: "rig"}
	tk := time.Now()
	r.Drop(ctx, kreq)
	rig.Eventually(t, time.Minute, "the restart worker paused after its claim", func() (bool, string) {
		j, _ := r.H.Journal(ctx, "kubeslot-restart.service")
		_, err := r.H.ReadFile("/opt/kubeslot/state/claimed-restart.json")
		return err == nil && strings.Contains(j, "paused before restart-node"), rig.TailLines(j, 5)
	})
	for _, cmd := range [][]string{
		{"systemctl", "stop", "kubeslot-restart.path"},
		{"systemctl", "kill", "-s", "KILL", "kubeslot-restart.service"},
		{"rm", "-f", pauseDropIn},
		{"systemctl", "daemon-reload"},
	} {
		if out, err := r.H.Run(ctx, cmd...); err != nil {
			t.Fatalf("%v: %v %s", cmd, err, out)
		}
	}
	if _, err := r.H.ReadFile("/opt/kubeslot/state/claimed-restart.json"); err != nil {
		t.Fatalf("the claimed request is gone after the kill: %v", err)
	}
	if out, err := r.H.Run(ctx, "systemctl", "start", "kubeslot-restart.path"); err != nil {
		t.Fatalf("start the path unit: %v %s", err, out)
	}
	s = r.WaitStatus(ctx, kreq.ID, 4*time.Minute)
	r.LogStatus("restart resumed after kill -9 of its worker", s)
	if s.Phase != requests.Succeeded || s.ActiveSlot != "b" {
		t.Errorf("restart after kill -9: status %+v", s)
	}
	if _, err := r.H.ReadFile("/opt/kubeslot/state/claimed-restart.json"); err == nil {
		t.Error("the claimed restart request is still there after its status was written")
	}
	rig.WaitNodeHeartbeat(t, ctx, r.Admin, r.Node, tk, 2*time.Minute, r.H)

	// 3. A target whose kubelet exits at once (a valid download with its sha256): rollback to b. It reports the
	// release asked for, so the standby's check of the binary passes and the failure comes at verify, after the
	// old node stopped.
	_, applied = r.Active()
	dir := t.TempDir()
	bad := filepath.Join(dir, "kubelet-exits")
	script := "#!/bin/sh\n[ \"$1\" = --version ] && { echo 'Kubernetes v" + applied.Config.Kubernetes.Version + "'; exit 0; }\n" +
		"echo 'rig: this kubelet exits at once' >&2\nexit 1\n"
	if err := os.WriteFile(bad, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	sum, err := r.Srv.Add("kubelet-exits", bad)
	if err != nil {
		t.Fatal(err)
	}
	broken := applied.Config
	broken.Artifacts.Kubelet.URL, broken.Artifacts.Kubelet.SHA256 = r.Srv.URL("kubelet-exits"), sum
	broken.Timeouts.NodeReady.Duration = 45 * time.Second
	breq := &requests.Request{Kind: requests.Repave, ID: requests.NewID(requests.Repave, 3, ""), MachineGeneration: 3,
		Reason: "rig: broken kubelet", Desired: broken}
	t2 := time.Now()
	r.Drop(ctx, breq)
	s = r.WaitStatus(ctx, breq.ID, 6*time.Minute)
	r.LogStatus("repave b->a with a kubelet that exits (rollback)", s)
	if s.Phase != requests.Failed || s.ActiveSlot != "b" || !strings.Contains(s.Message, "rolled back") || !strings.Contains(s.Message, "failed in verify") {
		t.Errorf("broken target: status %+v, want Failed in verify and rolled back to b", s)
	}
	rig.WaitNodeHeartbeat(t, ctx, r.Admin, r.Node, t2, 2*time.Minute, r.H)
	if slot, applied = r.Active(); slot != "b" || applied.Config.Artifacts.Kubelet.SHA256 == sum {
		t.Errorf("after the rollback: active %s with kubelet %s", slot, applied.Config.Artifacts.Kubelet.SHA256)
	}
	if out, err := r.H.Run(ctx, "test", "!", "-e", "/opt/kubeslot/applied/a.json"); err != nil {
		t.Errorf("the failed target has an applied configuration: %v %s", err, out)
	}

	// 3b. The same rollback killed (-9) while it waits for the old node: the old slot's kubelet posted its status
	// before the kill and will not post again for minutes, so the resumed wait must take its floor from the kubelet
	// that runs, not from the time of the resume.
	broken.Timeouts.NodeReady.Duration = 20 * time.Second
	rbreq := &requests.Request{Kind: requests.Repave, ID: requests.NewID(requests.Repave, 4, ""), MachineGeneration: 4,
		Reason: "rig: broken kubelet, killed in the rollback", Desired: broken}
	if out, err := r.H.Run(ctx, "systemctl", "stop", "kubeslot-repave.path"); err != nil {
		t.Fatalf("stop the path unit: %v %s", err, out)
	}
	r.Drop(ctx, rbreq)
	tRb := time.Now()
	r.PauseRepaver(ctx, "rig-repaver-rb", "rollback-verify")
	rig.WaitNodeHeartbeat(t, ctx, r.Admin, r.Node, tRb, 2*time.Minute, r.H) // the old slot's kubelet posted Ready
	if out, err := r.H.Run(ctx, "systemctl", "kill", "-s", "KILL", "rig-repaver-rb"); err != nil {
		t.Fatalf("kill the paused repaver: %v %s", err, out)
	}
	if data, err := r.H.ReadFile("/opt/kubeslot/state/repave.json"); err != nil || !strings.Contains(string(data), `"phase": "rollback-verify"`) {
		t.Fatalf("after kill -9 in the rollback the state file is %v: %s", err, data)
	}
	tRes := time.Now()
	if out, err := r.H.Run(ctx, "systemctl", "start", "kubeslot-repave.path"); err != nil {
		t.Fatalf("start the path unit: %v %s", err, out)
	}
	s = r.WaitStatus(ctx, rbreq.ID, 3*time.Minute)
	r.LogStatus("rollback resumed after kill -9 in rollback-verify", s)
	rig.Timing(t, "rollback resumed by the path unit after kill -9 in rollback-verify", time.Since(tRes))
	if s.Phase != requests.Failed || s.ActiveSlot != "b" || !strings.Contains(s.Message, "rolled back") {
		t.Errorf("resumed rollback: status %+v, want Failed and rolled back to b", s)
	}
	r.WaitResumed(ctx, "kill -9 in rollback-verify", 2*time.Minute)

	// 4. kill -9 of the repaver paused at each phase in turn; kubeslot-repave.path resumes it (it watches the
	// state file too). The path unit is stopped while the repaver is paused and killed, so the checks of what the
	// kill left are not raced by the resume, then started again: its PathExists= fires for the state file.
	want := "b"
	flip := map[string]string{"a": "b", "b": "a"}
	for i, phase := range []string{"prepare", "standby", "drain", "switch", "start", "verify", "commit", "uncordon", "clean"} {
		unit := fmt.Sprintf("rig-repaver-%d", i)
		// The target's kubelet may have posted its status before the kill (verify): the new heartbeat is newer
		// than the start of the interrupted run, and the kubelet does not post again for minutes.
		tRun := time.Now()
		if out, err := r.H.Run(ctx, "systemctl", "stop", "kubeslot-repave.path"); err != nil {
			t.Fatalf("stop the path unit: %v %s", err, out)
		}
		r.PauseRepaver(ctx, unit, phase)
		if out, err := r.H.Run(ctx, "systemctl", "kill", "-s", "KILL", unit); err != nil {
			t.Fatalf("kill %s: %v %s", unit, err, out)
		}
		data, err := r.H.ReadFile("/opt/kubeslot/state/repave.json")
		if err != nil || !strings.Contains(string(data), `"phase": "`+phase+`"`) {
			t.Fatalf("after kill -9 at %s the state file is %v: %s", phase, err, data)
		}
		if phase == "switch" { // the warm standby: the target booted, its kubelet held back; the old node serves
			// want is the active slot until the resume.
			if got := nodeUnitStates(ctx, r.H, flip[want]); got != "inactive inactive" {
				t.Errorf("warm target %s before the switch: kubelet, containerd %q, want inactive (held back)", flip[want], got)
			}
			if got := nodeUnitStates(ctx, r.H, want); got != "active active" {
				t.Errorf("old node %s before the switch: kubelet, containerd %q, want active", want, got)
			}
		}
		// Killed after the drain and before the uncordon, the Node is cordoned by kubeslot: the resume keeps it so
		// until the target is committed, then uncordons it.
		cordoned := map[string]bool{"switch": true, "start": true, "verify": true, "commit": true, "uncordon": true}[phase]
		if n, err := r.Admin.CoreV1().Nodes().Get(ctx, r.Node, metav1.GetOptions{}); err != nil {
			t.Errorf("kill -9 at %s: get Node: %v", phase, err)
		} else if cordoned != (n.Spec.Unschedulable && n.Annotations[drain.Annotation] != "") {
			t.Errorf("kill -9 at %s: Node unschedulable %v, annotation %q; want cordoned by kubeslot %v", phase,
				n.Spec.Unschedulable, n.Annotations[drain.Annotation], cordoned)
		}
		before := want
		if phase == "uncordon" || phase == "clean" { // committed already
			before = flip[want]
		}
		if slot, _ := r.Active(); slot != before {
			t.Errorf("kill -9 at %s: active %s before the resume, want %s", phase, slot, before)
		}
		t3 := time.Now()
		if out, err := r.H.Run(ctx, "systemctl", "start", "kubeslot-repave.path"); err != nil {
			t.Fatalf("start the path unit: %v %s", err, out)
		}
		r.WaitResumed(ctx, "kill -9 at "+phase, 6*time.Minute)
		rig.Timing(t, "repave resumed by the path unit after kill -9 at "+phase, time.Since(t3))
		want = flip[want]
		if slot, _ := r.Active(); slot != want {
			t.Errorf("after the resume from %s: active %s, want %s", phase, slot, want)
		}
		if n := rig.WaitNodeHeartbeat(t, ctx, r.Admin, r.Node, tRun, 2*time.Minute, r.H); n.Spec.Unschedulable || n.Annotations[drain.Annotation] != "" {
			t.Errorf("after the resume from %s: Node unschedulable %v, annotation %q", phase, n.Spec.Unschedulable, n.Annotations[drain.Annotation])
		}
	}

	// 5. By hand: systemctl start kubeslot-repave@<slot> rebuilds the active configuration onto that slot.
	other := flip[want]
	t4 := time.Now()
	if out, err := r.H.Run(ctx, "systemctl", "start", "kubeslot-repave@"+other+".service"); err != nil {
		j, _ := r.H.Journal(ctx, "kubeslot-repave@"+other+".service")
		t.Fatalf("repave by hand onto %s: %v %s\n%s\n%s", other, err, out, rig.TailLines(j, 60), rig.HostDiag(r.H))
	}
	rig.Timing(t, "repave by hand (systemctl start kubeslot-repave@"+other+")", time.Since(t4))
	if slot, _ := r.Active(); slot != other {
		t.Errorf("after the repave by hand: active %s, want %s", slot, other)
	}
	rig.WaitNodeHeartbeat(t, ctx, r.Admin, r.Node, t4, 2*time.Minute, r.H)
}

// TestRepavePowerCutOnRig: the rig host loses power during a repave, right after switch stopped the old node (the
// state file says start). After boot the node runs on a slot whose applied configuration is valid, and
// kubeslot-repave.path, which watches the state file, resumes and completes the repave onto b by itself: no request
// is left (it was claimed) and nobody starts the repaver by hand. Then the same with the power cut in commit, and a
// clean shutdown in verify.
func TestRepavePowerCutOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	r := rig.NewRepaveRig(t, ctx, "rpc", true)
	// Paused by hand: the path unit's own worker waits for the lock meanwhile (and defers, 69).
	r.PauseRepaver(ctx, "rig-repaver-cut", "start")
	if out, err := r.H.Run(ctx, "systemctl", "is-active", "systemd-nspawn@a.service"); err == nil {
		t.Errorf("the old node still runs after switch: %s", out)
	}
	if err := r.H.Kill(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := r.H.Boot(ctx); err != nil {
		t.Fatalf("boot again: %v", err)
	}
	// Whatever point the resume has reached, the active slot's applied configuration is valid.
	if slot, a := r.Active(); a.Slot != slot || a.Config == nil || (slot != "a" && slot != "b") {
		t.Fatalf("after the power cut: active %q, applied %+v", slot, a)
	}
	r.WaitResumed(ctx, "the power cut", 8*time.Minute)
	rig.Timing(t, "repave: power cut in switch -> resumed by the path unit after boot", time.Since(t0))
	if slot, _ := r.Active(); slot != "b" {
		t.Errorf("after the resume: active %s, want b", slot)
	}
	j, _ := r.H.Journal(ctx, "kubeslot-repave@next.service")
	if !strings.Contains(j, "resuming an interrupted repave") {
		t.Errorf("kubeslot-repave@next.service did not resume the repave:\n%s", rig.TailLines(j, 40))
	}
	rig.WaitNodeHeartbeat(t, ctx, r.Admin, r.Node, t0, 2*time.Minute, r.H)
	if out, err := r.H.Run(ctx, "systemctl", "is-active", "systemd-nspawn@a.service"); err == nil {
		t.Errorf("node a still runs after the resume: %s", out)
	}

	// Power cut in commit: the target a was verified, nothing is committed yet, so the host
	// boots the old node b (its machine is enabled at boot until commit ends). The resume must start and verify a
	// again before it commits it: applied/active may never name a slot whose node is not running.
	r.PauseRepaver(ctx, "rig-repaver-cut-commit", "commit")
	if err := r.H.Kill(); err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	if err := r.H.Boot(ctx); err != nil {
		t.Fatalf("boot again: %v", err)
	}
	r.WaitResumed(ctx, "the power cut in commit", 8*time.Minute)
	rig.Timing(t, "repave: power cut in commit -> resumed (re-verified) by the path unit after boot", time.Since(t1))
	if slot, _ := r.Active(); slot != "a" {
		t.Errorf("after the resume from commit: active %s, want a", slot)
	}
	if out, err := r.H.Run(ctx, "systemctl", "is-active", "systemd-nspawn@a.service"); err != nil {
		t.Errorf("applied/active names a, but its node is not running: %v %s", err, out)
	}
	if out, err := r.H.Run(ctx, "systemctl", "is-active", "systemd-nspawn@b.service"); err == nil {
		t.Errorf("node b still runs after the resume: %s", out)
	}
	rig.WaitNodeHeartbeat(t, ctx, r.Admin, r.Node, t1, 2*time.Minute, r.H)

	// A clean shutdown during a requested repave: SIGTERM is not failure. The path unit's own
	// worker pauses in verify (a drop-in in /run, gone with the reboot), the host powers off, and after the boot
	// the path unit resumes the same request to Succeeded: no Failed status, no rollback.
	if err := r.H.WriteFile("/run/systemd/system/kubeslot-repave@.service.d/zz-pause.conf",
		[]byte("[Service]\nEnvironment="+transition.EnvPauseAt+"=verify\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := r.H.Run(ctx, "systemctl", "daemon-reload"); err != nil {
		t.Fatalf("daemon-reload: %v %s", err, out)
	}
	_, applied := r.Active()
	desired := applied.Config
	desired.Kubernetes.Labels["kubeslot.dev/round"] = "shutdown"
	req := &requests.Request{Kind: requests.Repave, ID: requests.NewID(requests.Repave, 7, ""), MachineGeneration: 7,
		Reason: "rig: a shutdown during verify", Desired: desired}
	r.Drop(ctx, req)
	rig.Eventually(t, 5*time.Minute, "the path unit's repaver paused at verify", func() (bool, string) {
		j, _ := r.H.Journal(ctx, "kubeslot-repave@next.service")
		return strings.Contains(j, "paused before verify"), rig.TailLines(j, 3)
	})
	if err := r.H.PowerOff(ctx); err != nil {
		t.Fatalf("power off: %v", err)
	}
	if data, err := r.H.ReadFile("/opt/kubeslot/status/" + req.ID + ".json"); err == nil && strings.Contains(string(data), `"Failed"`) {
		t.Errorf("a shutdown marked the repave Failed: %s", data)
	}
	t2 := time.Now()
	if err := r.H.Boot(ctx); err != nil {
		t.Fatalf("boot again: %v", err)
	}
	s := r.WaitStatus(ctx, req.ID, 8*time.Minute)
	r.LogStatus("repave stopped by a shutdown in verify, resumed after boot", s)
	rig.Timing(t, "repave: shutdown in verify -> resumed to Succeeded after boot", time.Since(t2))
	if s.Phase != requests.Succeeded || s.ActiveSlot != "b" {
		t.Errorf("after the shutdown and boot: %s on %s: %s, want Succeeded on b", s.Phase, s.ActiveSlot, s.Message)
	}
	rig.WaitNodeHeartbeat(t, ctx, r.Admin, r.Node, t2, 2*time.Minute, r.H)
}

// TestRepaveTwoTriggersOnRig: triggers that meet give one repave each. The same request written again while it
// runs (a writer that retried) runs once; a second request with a new ID while the first runs is taken after it.
func TestRepaveTwoTriggersOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()
	r := rig.NewRepaveRig(t, ctx, "rpt", false)
	request := func(gen int64, round string) *requests.Request {
		_, applied := r.Active()
		desired := applied.Config
		desired.Kubernetes.Labels["kubeslot.dev/round"] = round
		return &requests.Request{Kind: requests.Repave, ID: requests.NewID(requests.Repave, gen, ""), MachineGeneration: gen,
			Reason: "rig: round " + round, Desired: desired}
	}

	// 1. The same ID twice: the second write lands while the first is claimed and running.
	r1 := request(2, "1")
	r.Drop(ctx, r1)
	r.WaitFile(ctx, "/opt/kubeslot/state/claimed-repave.json", 2*time.Minute)
	r.Drop(ctx, r1)
	s := r.WaitStatus(ctx, r1.ID, 6*time.Minute)
	r.LogStatus("repave a->b (its request written twice)", s)
	if s.Phase != requests.Succeeded || s.ActiveSlot != "b" {
		t.Fatalf("first request: %+v", s)
	}
	r.WaitIdle(ctx, 4*time.Minute)
	if slot, _ := r.Active(); slot != "b" {
		t.Errorf("after the same request written twice: active %s, want b (it ran twice?)", slot)
	}
	j, _ := r.H.Journal(ctx, "kubeslot-repave@next.service")
	if n := strings.Count(j, "repave phase done") / 6; strings.Count(j, "claimed request") != 1 || n != 1 {
		t.Errorf("request %s: %d claims, %d full runs in the journal (want 1 each):\n%s", r1.ID,
			strings.Count(j, "claimed request"), n, rig.TailLines(j, 40))
	}
	if !strings.Contains(j, "request already done") {
		t.Errorf("the second write of %s was not recognized as done:\n%s", r1.ID, rig.TailLines(j, 40))
	}

	// 2. A new request while one runs: taken after it, not dropped and not merged.
	r2 := request(3, "2")
	r.Drop(ctx, r2)
	r.WaitFile(ctx, "/opt/kubeslot/state/claimed-repave.json", 2*time.Minute)
	r3 := request(4, "3")
	r.Drop(ctx, r3)
	s2 := r.WaitStatus(ctx, r2.ID, 6*time.Minute)
	r.LogStatus("repave b->a (a second request dropped while it ran)", s2)
	s3 := r.WaitStatus(ctx, r3.ID, 6*time.Minute)
	r.LogStatus("repave a->b (the request dropped during the previous one)", s3)
	if s2.Phase != requests.Succeeded || s2.ActiveSlot != "a" || s3.Phase != requests.Succeeded || s3.ActiveSlot != "b" {
		t.Errorf("statuses %+v then %+v, want Succeeded on a then on b", s2, s3)
	}
	if len(s3.Phases) > 0 && s3.Phases[0].StartedAt.Before(s2.UpdatedAt) {
		t.Errorf("the second request started at %s, before the first finished at %s", s3.Phases[0].StartedAt, s2.UpdatedAt)
	}
	slot, applied := r.Active()
	if slot != "b" || applied.Config.Kubernetes.Labels["kubeslot.dev/round"] != "3" {
		t.Errorf("at the end: active %s, labels %v", slot, applied.Config.Kubernetes.Labels)
	}
	n, err := r.Admin.CoreV1().Nodes().Get(ctx, r.Node, metav1.GetOptions{})
	if err != nil || n.Labels["kubeslot.dev/round"] != "3" {
		t.Errorf("Node label kubeslot.dev/round after the last repave: %v (err %v)", n.Labels, err)
	}
}

// TestRepaveMachineSpecOnRig is the repave end to end: an admin changes the Machine's node configuration (a label)
// and its update policy to Immediate; the real watcher, left running by the bootstrap, drops the repave request, the
// path unit starts the repaver, and the node moves onto slot b with a real kubelet; the Machine reports slot b and
// the new fingerprint, and the Node carries the label.
func TestRepaveMachineSpecOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	r := rig.NewRepaveRig(t, ctx, "rpm", false)
	var m *v1alpha1.Machine
	wctx, wcancel := context.WithTimeout(ctx, 3*time.Minute)
	for m == nil {
		got, err := r.MC.GetMachine(wctx, r.Node)
		if err == nil && got.Status.ActiveSlot == "a" {
			m = got
			break
		}
		select {
		case <-wctx.Done():
			j, _ := r.H.Journal(context.Background(), "kubeslot-watcher.service")
			t.Fatalf("the watcher did not register Machine %s on slot a: %v\n%s", r.Node, err, rig.TailLines(j, 40))
		case <-time.After(time.Second):
		}
	}
	wcancel()
	if m.Spec.Node.Labels == nil {
		m.Spec.Node.Labels = map[string]v1alpha1.LabelValue{}
	}
	m.Spec.Node.Labels["kubeslot.dev/spec"] = "changed"
	m.Spec.UpdatePolicy = v1alpha1.UpdateImmediate
	t0 := time.Now()
	if _, err := r.MC.UpdateMachine(ctx, m); err != nil {
		t.Fatalf("update the Machine spec: %v", err)
	}
	wctx, wcancel = context.WithTimeout(ctx, 8*time.Minute)
	defer wcancel()
	last := ""
	for {
		got, err := r.MC.GetMachine(wctx, r.Node)
		if err == nil {
			last = fmt.Sprintf("slot %q phase %s generation %d/%d", got.Status.ActiveSlot, got.Status.Phase,
				got.Status.ObservedGeneration, got.Generation)
			if got.Status.ActiveSlot == "b" && got.Status.Applied != nil {
				m = got
				break
			}
		}
		select {
		case <-wctx.Done():
			j, _ := r.H.Journal(context.Background(), "kubeslot-watcher.service")
			j2, _ := r.H.Journal(context.Background(), "kubeslot-repave@next.service")
			t.Fatalf("the Machine did not report slot b (last: %s, err %v)\nwatcher:\n%s\nrepaver:\n%s\n%s", last, err,
				rig.TailLines(j, 40), rig.TailLines(j2, 40), rig.HostDiag(r.H))
		case <-time.After(time.Second):
		}
	}
	rig.Timing(t, "repave from a Machine spec change: spec updated -> Machine status reports slot b", time.Since(t0))
	n := rig.WaitNodeHeartbeat(t, ctx, r.Admin, r.Node, t0, 2*time.Minute, r.H)
	slot, applied := r.Active()
	if slot != "b" || applied.Config.Kubernetes.Labels["kubeslot.dev/spec"] != "changed" {
		t.Errorf("host: active %s with labels %v", slot, applied.Config.Kubernetes.Labels)
	}
	if string(m.Status.Applied.Fingerprint) != applied.Fingerprint {
		t.Errorf("Machine reports fingerprint %s, the host's applied configuration has %s", m.Status.Applied.Fingerprint, applied.Fingerprint)
	}
	// The repaver patches the Node's labels after the commit that the Machine status already shows: wait for it.
	_ = n
	rig.Eventually(t, time.Minute, "Node label kubeslot.dev/spec=changed", func() (bool, string) {
		got, err := r.Admin.CoreV1().Nodes().Get(ctx, r.Node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return got.Labels["kubeslot.dev/spec"] == "changed", fmt.Sprintf("labels %v", got.Labels)
	})
	t.Logf("Machine %s: slot %s, fingerprint %s, phase %s", m.Name, m.Status.ActiveSlot, m.Status.Applied.Fingerprint, m.Status.Phase)
}

// nodeUnitStates is "<kubelet> <containerd>" as the node machine of slot reports them (is-active).
func nodeUnitStates(ctx context.Context, h *sdhost.Host, slot string) string {
	out, _ := h.Run(ctx, "systemctl", "-M", slot, "is-active", "kubelet.service", "containerd.service")
	return strings.Join(strings.Fields(string(out)), " ")
}
