package integration

// The repaver on the rig (issue 7): a bootstrapped host with a real kubelet is repaved onto slot b by a request
// with a changed desired configuration (through kubeslot-repave.path), restarted in place by a restart request,
// refused a target whose kubelet exits at once (rollback to the old slot), and resumed after kill -9 of the
// repaver in the switch and verify phases. Figures are printed, never asserted. Helpers: repave_rig_test.go.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/requests"
)

func TestRepaveOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 18*time.Minute)
	defer cancel()
	r := newRepaveRig(t, ctx, "rp", false)
	slot, applied := r.active()
	if slot != "a" {
		t.Fatalf("bootstrap left active slot %q", slot)
	}

	// 1. A repave request with a new node label, as the watcher drops it; kubeslot-repave.path fires.
	desired := applied.Config
	desired.Kubernetes.Labels["kubeslot.dev/repaved"] = "yes"
	req := &requests.Request{Kind: requests.Repave, ID: requests.NewID(requests.Repave, 2, ""), MachineGeneration: 2,
		Reason: "rig: new label", Desired: desired}
	t0 := time.Now()
	r.drop(ctx, req)
	s := r.waitStatus(ctx, req.ID, 6*time.Minute)
	whole := time.Since(t0)
	r.logStatus("repave a->b", s)
	rigTiming(t, "repave a->b: request dropped -> status Succeeded (path unit included)", whole)
	if s.Phase != requests.Succeeded || s.ActiveSlot != "b" {
		t.Fatalf("repave status %+v", s)
	}
	n := waitNodeHeartbeat(t, ctx, r.admin, r.node, t0, 2*time.Minute, r.h)
	t.Logf("Node %s label kubeslot.dev/repaved=%q (the kubelet sets --node-labels only when it registers a Node; "+
		"a repave keeps the Node, so a label change reaches the applied configuration, not the existing Node)",
		r.node, n.Labels["kubeslot.dev/repaved"])
	slot, applied = r.active()
	if slot != "b" || applied.Config.Kubernetes.Labels["kubeslot.dev/repaved"] != "yes" {
		t.Errorf("after the repave: active %s, labels %v", slot, applied.Config.Kubernetes.Labels)
	}
	for _, p := range []string{"/var/lib/machines/a", "/opt/kubeslot/applied/a.json", "/opt/kubeslot/state/repave.json",
		"/opt/kubeslot/state/claimed-repave.json", "/etc/systemd/system/machines.target.wants/systemd-nspawn@a.service"} {
		if out, err := r.h.Run(ctx, "test", "!", "-e", p); err != nil {
			t.Errorf("%s still there after the repave: %v %s", p, err, out)
		}
	}
	if out, err := r.h.Run(ctx, "systemctl", "is-enabled", "systemd-nspawn@b.service"); err != nil || strings.TrimSpace(string(out)) != "enabled" {
		t.Errorf("systemd-nspawn@b not enabled at boot: %v %s", err, out)
	}
	if out, err := r.h.Run(ctx, "/opt/kubeslot/current/kubeslot", "status"); err != nil || !strings.Contains(string(out), "b (nspawn mode") {
		t.Errorf("kubeslot status does not show slot b: %v\n%s", err, out)
	}
	// The fast path: our preparation (unpack from the verified cache) against a plain full copy of the rootfs.
	prep := r.phase(s, "prepare")
	c0 := time.Now()
	if out, err := r.h.Run(ctx, "sh", "-c", "cp -a /var/lib/machines/b /var/lib/machines/.copytest && sync"); err != nil {
		t.Errorf("cp -a: %v %s", err, out)
	}
	cp := time.Since(c0)
	_, _ = r.h.Run(ctx, "rm", "-rf", "/var/lib/machines/.copytest")
	du, _ := r.h.Run(ctx, "du", "-sh", "/var/lib/machines/b")
	rigTiming(t, "repave: target slot prepared from the cache (prepare phase)", prep)
	rigTiming(t, "repave: cp -a of the same rootfs", cp)
	t.Logf("FIGURE repave: prepare / cp -a = %.2f (rootfs %s)", float64(prep)/float64(cp), strings.Fields(string(du) + " ?")[0])

	// 2. Restart in place through the restart request and kubeslot-restart.path.
	rreq := &requests.Request{Kind: requests.Restart, ID: requests.NewID(requests.Restart, 2, "rig-restart"), MachineGeneration: 2,
		Operation: "rig-restart", Reason: "rig"}
	t1 := time.Now()
	r.drop(ctx, rreq)
	s = r.waitStatus(ctx, rreq.ID, 4*time.Minute)
	r.logStatus("restart in place", s)
	if s.Phase != requests.Succeeded || s.ActiveSlot != "b" {
		t.Errorf("restart status %+v", s)
	}
	waitNodeHeartbeat(t, ctx, r.admin, r.node, t1, 2*time.Minute, r.h)

	// 3. A target whose kubelet exits at once (a valid download with its sha256): rollback to b.
	dir := t.TempDir()
	bad := filepath.Join(dir, "kubelet-exits")
	if err := os.WriteFile(bad, []byte("#!/bin/sh\necho 'rig: this kubelet exits at once' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	sum, err := r.srv.Add("kubelet-exits", bad)
	if err != nil {
		t.Fatal(err)
	}
	_, applied = r.active()
	broken := applied.Config
	broken.Artifacts.Kubelet.URL, broken.Artifacts.Kubelet.SHA256 = r.srv.URL("kubelet-exits"), sum
	broken.Timeouts.NodeReady.Duration = 45 * time.Second
	breq := &requests.Request{Kind: requests.Repave, ID: requests.NewID(requests.Repave, 3, ""), MachineGeneration: 3,
		Reason: "rig: broken kubelet", Desired: broken}
	t2 := time.Now()
	r.drop(ctx, breq)
	s = r.waitStatus(ctx, breq.ID, 6*time.Minute)
	r.logStatus("repave b->a with a kubelet that exits (rollback)", s)
	if s.Phase != requests.Failed || s.ActiveSlot != "b" || !strings.Contains(s.Message, "rolled back") {
		t.Errorf("broken target: status %+v, want Failed and rolled back to b", s)
	}
	waitNodeHeartbeat(t, ctx, r.admin, r.node, t2, 2*time.Minute, r.h)
	if slot, applied = r.active(); slot != "b" || applied.Config.Artifacts.Kubelet.SHA256 == sum {
		t.Errorf("after the rollback: active %s with kubelet %s", slot, applied.Config.Artifacts.Kubelet.SHA256)
	}
	if out, err := r.h.Run(ctx, "test", "!", "-e", "/opt/kubeslot/applied/a.json"); err != nil {
		t.Errorf("the failed target has an applied configuration: %v %s", err, out)
	}

	// 4. kill -9 of the repaver paused at each phase in turn; a manual start of kubeslot-repave@next resumes it.
	want := "b"
	flip := map[string]string{"a": "b", "b": "a"}
	for i, phase := range []string{"prepare", "switch", "start", "verify", "commit", "clean"} {
		unit := fmt.Sprintf("rig-repaver-%d", i)
		// The target's kubelet may have posted its status before the kill (verify): the new heartbeat is newer
		// than the start of the interrupted run, and the kubelet does not post again for minutes.
		tRun := time.Now()
		r.pauseRepaver(ctx, unit, phase)
		if out, err := r.h.Run(ctx, "systemctl", "kill", "-s", "KILL", unit); err != nil {
			t.Fatalf("kill %s: %v %s", unit, err, out)
		}
		data, err := r.h.ReadFile("/opt/kubeslot/state/repave.json")
		if err != nil || !strings.Contains(string(data), `"phase": "`+phase+`"`) {
			t.Fatalf("after kill -9 at %s the state file is %v: %s", phase, err, data)
		}
		before := want
		if phase == "clean" { // committed already
			before = flip[want]
		}
		if slot, _ := r.active(); slot != before {
			t.Errorf("kill -9 at %s: active %s before the resume, want %s", phase, slot, before)
		}
		t3 := time.Now()
		if out, err := r.h.Run(ctx, "systemctl", "start", "kubeslot-repave@next.service"); err != nil {
			j, _ := r.h.Journal(ctx, "kubeslot-repave@next.service")
			t.Fatalf("resume after kill -9 at %s: %v %s\n%s\n%s", phase, err, out, tailLines(j, 60), hostDiag(r.h))
		}
		rigTiming(t, "repave resumed after kill -9 at "+phase, time.Since(t3))
		want = flip[want]
		if slot, _ := r.active(); slot != want {
			t.Errorf("after the resume from %s: active %s, want %s", phase, slot, want)
		}
		waitNodeHeartbeat(t, ctx, r.admin, r.node, tRun, 2*time.Minute, r.h)
		if out, err := r.h.Run(ctx, "test", "!", "-e", "/opt/kubeslot/state/repave.json"); err != nil {
			t.Errorf("state left after the resume from %s: %v %s", phase, err, out)
		}
	}
}

// TestRepavePowerCutOnRig: the rig host loses power during a repave, right after switch stopped the old node (the
// state file says start). After boot the node runs on slot a, whose applied configuration is valid and still the
// active one; a manual start of the repaver then resumes and completes the repave onto b.
func TestRepavePowerCutOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	r := newRepaveRig(t, ctx, "rpc", true)
	r.pauseRepaver(ctx, "rig-repaver-cut", "start")
	if out, err := r.h.Run(ctx, "systemctl", "is-active", "systemd-nspawn@a.service"); err == nil {
		t.Errorf("the old node still runs after switch: %s", out)
	}
	if err := r.h.Kill(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := r.h.Boot(ctx); err != nil {
		t.Fatalf("boot again: %v", err)
	}
	waitNodeHeartbeat(t, ctx, r.admin, r.node, t0, 3*time.Minute, r.h)
	rigTiming(t, "repave: power cut in switch to Node Ready again", time.Since(t0))
	if slot, a := r.active(); slot != "a" || a.Slot != "a" || a.Config == nil {
		t.Fatalf("after the power cut: active %q, applied %+v", slot, a)
	}
	if out, err := r.h.Run(ctx, "systemctl", "is-active", "systemd-nspawn@a.service"); err != nil {
		t.Errorf("node a not running after the boot: %v %s", err, out)
	}
	if _, err := r.h.ReadFile("/opt/kubeslot/state/repave.json"); err != nil {
		t.Errorf("the repave state did not survive the power cut: %v", err)
	}
	t1 := time.Now()
	if out, err := r.h.Run(ctx, "systemctl", "start", "kubeslot-repave@next.service"); err != nil {
		j, _ := r.h.Journal(ctx, "kubeslot-repave@next.service")
		t.Fatalf("resume after the power cut: %v %s\n%s\n%s", err, out, tailLines(j, 60), hostDiag(r.h))
	}
	rigTiming(t, "repave: resumed after the power cut", time.Since(t1))
	if slot, _ := r.active(); slot != "b" {
		t.Errorf("after the resume: active %s, want b", slot)
	}
	waitNodeHeartbeat(t, ctx, r.admin, r.node, t1, 2*time.Minute, r.h)
	if out, err := r.h.Run(ctx, "systemctl", "is-active", "systemd-nspawn@a.service"); err == nil {
		t.Errorf("node a still runs after the resume: %s", out)
	}
}
