package repave

// TestSelfHealOnRig: the self-healing paths, each shown on one real host
// (systemd booted in private namespaces, the node in a systemd-nspawn machine, the control plane of the test
// binary), bootstrapped once through its first-boot unit and kept across a power cut. The items run as subtests in
// this order, because each leaves the host as the next needs it and the reset, which takes the host apart, goes
// last: the watcher's backoff, a removal killed between its two files, a commit inside the watcher's read, a slow
// --version at boot, a reset step that fails. Each subtest's function says what it guards against. Helpers: selfheal_helpers_test.go.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kubeslot/kubeslot/integration/kube"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/transition"
	"github.com/kubeslot/kubeslot/units"
)

func TestSelfHealOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 25*time.Minute)
	defer cancel()
	r := rig.NewRepaveRig(t, ctx, "heal", true)
	waitWatcherActive(t, ctx, r.Rig)
	r.EventuallyMachine(ctx, "the watcher registered and reported its Machine", func(m *v1alpha1.Machine) bool {
		return m.Status.AgentVersion != "" && m.Status.ActiveSlot == "a"
	})
	for _, item := range []struct {
		name string
		run  func(*testing.T, context.Context, *rig.RepaveRig)
	}{
		{"item9-permanent-api-error-backs-off", healBackoff},
		{"item6-removal-killed-between-its-files", healRemovalKilled},
		{"item10-commit-inside-the-watchers-read", healCommitInRead},
		{"item12-slow-version-at-boot", healSlowVersion},
		{"item8-reset-step-fails", healResetStepFails},
	} {
		t0 := time.Now()
		ok := t.Run(item.name, func(t *testing.T) { item.run(t, ctx, r.ForTest(t)) })
		rig.Timing(t, "self-heal rig: "+item.name, time.Since(t0))
		if !ok {
			t.Fatalf("%s failed; the later items need the host it leaves", item.name)
		}
	}
}

// healBackoff: the watcher's action hits a permanent API error. The apiserver refuses every
// Machine status write of the node (a ValidatingAdmissionPolicy, as an admission policy of the cluster would), and
// the Machine's status is made stale (its agent version), so the watcher must write it and cannot. Counted at the
// apiserver (its audit log) over 45 s: the refused write is repeated with backoff (2, 4, 8, 16, 32 s: five tries),
// not every 2 s (about 22 tries), and the watcher's journal names the error once, not once per
// try. Once the policy goes, a touch of the Machine brings the watcher back to writing its status.
func healBackoff(t *testing.T, ctx context.Context, r *rig.RepaveRig) {
	const window = 45 * time.Second
	const message = "rig: Machine status writes of this node are refused"
	allow := r.DenyStatusWrites(ctx, message)
	logged := func() int { return r.JournalCount(ctx, units.Watcher, "action failed", message) }
	before := logged()
	from := time.Now()
	r.PatchMachine(ctx, "status", `{"status":{"agentVersion":"rig-stale"}}`)
	time.Sleep(window)
	to := time.Now()

	user := "system:node:" + r.Node
	refused, err := r.CP.AuditEvents(func(e kube.AuditEvent) bool {
		return e.Stage == "ResponseComplete" && e.User.Username == user && e.Resource() == v1alpha1.MachinesResource &&
			strings.Contains(e.RequestURI, "/status") && !strings.Contains(e.RequestURI, "dryRun") &&
			(e.Verb == "update" || e.Verb == "patch") && e.ResponseStatus != nil && e.ResponseStatus.Code >= 400 &&
			!e.Received.Before(from) && !e.Received.After(to)
	})
	if err != nil {
		t.Fatal(err)
	}
	var gaps []string
	for i := 1; i < len(refused); i++ {
		gaps = append(gaps, refused[i].Received.Sub(refused[i-1].Received).Round(100*time.Millisecond).String())
	}
	t.Logf("refused Machine status writes of the watcher in %s: %d, apart %v", window, len(refused), gaps)
	rig.Figures.AddValue("watcher: a refused Machine status write repeated within 45 s (apiserver audit; before the fix ~22)", float64(len(refused)), "requests")
	switch {
	case len(refused) == 0:
		t.Errorf("the watcher never tried to write its stale Machine status within %s:\n%s", window, r.WatcherTail(ctx))
	case len(refused) > 8:
		t.Errorf("the watcher repeated a refused status write %d times in %s (apart %v): not backed off", len(refused), window, gaps)
	}
	if n := logged() - before; n != 1 {
		t.Errorf("the watcher logged the refused write %d times in %s, want once:\n%s", n, window, r.WatcherTail(ctx))
	}

	allow()
	t1 := time.Now()
	rig.Eventually(t, 2*time.Minute, "the watcher writes its Machine status again once the policy is gone", func() (bool, string) {
		r.NudgeWatcher(ctx)
		time.Sleep(time.Second)
		m, err := r.MC.GetMachine(ctx, r.Node)
		if err != nil {
			return false, err.Error()
		}
		return m.Status.AgentVersion != "rig-stale", "agent version " + m.Status.AgentVersion
	})
	rig.Timing(t, "watcher: status written again after the refusal ended (nudged)", time.Since(t1))
}

// healRemovalKilled: a repave's clean killed between the two removals of
// state.RemoveChecksummed: the old slot's applied/<slot>.json is gone, its sidecar .sha256 is left. The repaver
// paused at the start of clean (test hook) is killed -9, and the data file is removed as the killed removal's
// first step had; the old slot's tree, which clean removes before its applied configuration, is left for the
// resumed clean (its removal is idempotent). The path unit resumes the repave (it watches state/repave.json), and
// it must finish: Succeeded on the target, applied/active naming it, the sidecar gone, the pair of the target and
// active verified by sha256sum, the Node Ready from the target's kubelet. Were the sidecar alone read as
// corruption, the resumed clean could not load the old slot's configuration to remove it, would fail, and every
// later repave would resume the same clean first (healCommitInRead's repave is that later repave).
func healRemovalKilled(t *testing.T, ctx context.Context, r *rig.RepaveRig) {
	from, applied := r.Active()
	to := otherSlot(from)
	pauseDropIn := "/run/systemd/system/kubeslot-repave@.service.d/zz-pause.conf"
	r.Sh(ctx, "mkdir -p "+pauseDropIn[:strings.LastIndex(pauseDropIn, "/")]+" && printf '[Service]\\nEnvironment="+
		transition.EnvPauseAt+"=clean\\n' >"+pauseDropIn+" && systemctl daemon-reload")
	desired := applied.Config
	desired.Kubernetes.Labels["kubeslot.dev/heal"] = "removal-killed"
	req := &requests.Request{Kind: requests.Repave, ID: requests.NewID(requests.Repave, 61, ""), MachineGeneration: 61,
		Reason: "rig: clean killed between two removals", Desired: desired}
	t0 := time.Now()
	r.Drop(ctx, req)
	rig.Eventually(t, 5*time.Minute, "the path unit's repaver paused at clean", func() (bool, string) {
		j, _ := r.H.Journal(ctx, "kubeslot-repave@next.service")
		return strings.Contains(j, "paused before clean"), rig.TailLines(j, 3)
	})
	r.Sh(ctx, "systemctl stop kubeslot-repave.path && systemctl kill -s KILL kubeslot-repave@next.service")
	rig.Eventually(t, time.Minute, "the killed repaver's unit inactive", func() (bool, string) {
		out, _ := r.H.Run(ctx, "systemctl", "is-active", "kubeslot-repave@next.service")
		st := strings.TrimSpace(string(out))
		return st != "active" && st != "activating" && st != "deactivating", st
	})
	r.Sh(ctx, "rm "+pauseDropIn+" && systemctl daemon-reload")
	// What the killed removal left: the data gone, its sidecar there.
	data := "/opt/kubeslot/applied/" + from + ".json"
	r.Sh(ctx, "test -e /opt/kubeslot/state/repave.json && test -e "+data+".sha256 && rm "+data)
	t.Logf("left by the killed clean: %s", r.Sh(ctx, "ls /opt/kubeslot/applied | tr '\\n' ' '"))

	r.Sh(ctx, "systemctl start kubeslot-repave.path")
	s := r.WaitStatus(ctx, req.ID, 5*time.Minute)
	r.LogStatus("repave resumed after a clean killed between two removals", s)
	if s.Phase != requests.Succeeded || s.ActiveSlot != to {
		t.Fatalf("resumed repave: %s on %q: %s, want Succeeded on %s", s.Phase, s.ActiveSlot, s.Message, to)
	}
	if j, _ := r.H.Journal(ctx, "kubeslot-repave@next.service"); !strings.Contains(j, "resuming an interrupted repave") {
		t.Errorf("the repave was not resumed from its state file:\n%s", rig.TailLines(j, 30))
	}
	r.WaitIdle(ctx, time.Minute)
	if slot, a := r.Active(); slot != to || a.Config.Kubernetes.Labels["kubeslot.dev/heal"] != "removal-killed" {
		t.Errorf("applied/active names %s (labels %v), want %s with the new label", slot, a.Config.Kubernetes.Labels, to)
	}
	if out := r.Sh(ctx, "ls -A /opt/kubeslot/applied | tr '\\n' ' '"); strings.Contains(out, from+".json") {
		t.Errorf("the old slot's applied files are still there: %s", out)
	}
	r.Sh(ctx, "cd /opt/kubeslot/applied && sha256sum -c --quiet "+to+".json.sha256 active.sha256")
	if out, err := r.H.Run(ctx, "systemctl", "is-active", "systemd-nspawn@"+to+".service"); err != nil {
		t.Errorf("the node of the active slot %s is not running: %v %s", to, err, out)
	}
	if out, err := r.H.Run(ctx, "systemctl", "is-active", "systemd-nspawn@"+from+".service"); err == nil {
		t.Errorf("the old slot's node %s still runs: %s", from, out)
	}
	rig.WaitNodeHeartbeat(t, ctx, r.Admin, r.Node, t0, 2*time.Minute, r.H)
}

// healCommitInRead: the watcher reads the applied state (applied/active, then that slot's
// configuration) without the lock, and a real repave commits and cleans inside that read: active moves to the
// target and the old slot's configuration goes. The watcher's read is held between its two files by its test
// hook (KUBESLOT_TEST_WATCHER_READ_GATE, a gate file) from before the repave starts until it has finished, so the
// interleaving happens every run; without the hook it happens when a commit lands in the microseconds between the
// two reads. Every version of the Machine is watched from before the gate until the watcher reports the target
// slot: Degraded=True must never appear, and the repave succeeds. What it guards against: the held read finds
// the old slot's configuration gone and publishes Degraded ("the active slot has no applied configuration").
func healCommitInRead(t *testing.T, ctx context.Context, r *rig.RepaveRig) {
	from, applied := r.Active()
	to := otherSlot(from)
	const gate = "/run/kubeslot-rig-read-gate"
	gateDropIn := "/run/systemd/system/" + units.Watcher + ".d/zz-read-gate.conf"
	r.Sh(ctx, "mkdir -p /run/systemd/system/"+units.Watcher+".d && printf '[Service]\\nEnvironment=KUBESLOT_TEST_WATCHER_READ_GATE="+
		gate+"\\n' >"+gateDropIn+" && systemctl daemon-reload && systemctl restart "+units.Watcher)
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = r.H.Run(cctx, "sh", "-c", "rm -f "+gate+" "+gateDropIn+" && systemctl daemon-reload && systemctl restart "+units.Watcher)
	}()
	waitWatcherActive(t, ctx, r.Rig)

	// Every version of the Machine from now on.
	w, err := r.MC.WatchMachine(ctx, r.Node, "")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var degraded []string
	var slot string
	versions := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			m, ok := ev.Object.(*v1alpha1.Machine)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
				continue
			}
			mu.Lock()
			versions++
			slot = m.Status.ActiveSlot
			if c := apimeta.FindStatusCondition(m.Status.Conditions, v1alpha1.ConditionDegraded); c != nil && c.Status == "True" {
				degraded = append(degraded, fmt.Sprintf("rv %s: %s: %s", m.ResourceVersion, c.Reason, c.Message))
			}
			mu.Unlock()
		}
	}()
	defer func() { w.Stop(); <-done }()

	held := func() int { return r.JournalCount(ctx, units.Watcher, "test hook: holding the applied-state read") }
	released := func() int { return r.JournalCount(ctx, units.Watcher, "test hook: applied-state read released") }
	h0, rel0 := held(), released()
	r.Sh(ctx, "touch "+gate)
	r.NudgeWatcher(ctx)
	rig.Eventually(t, time.Minute, "the watcher's read held between applied/active and the slot's configuration", func() (bool, string) {
		return held() > h0, r.WatcherTail(ctx)
	})

	desired := applied.Config
	desired.Kubernetes.Labels["kubeslot.dev/heal"] = "commit-in-read"
	req := &requests.Request{Kind: requests.Repave, ID: requests.NewID(requests.Repave, 62, ""), MachineGeneration: 62,
		Reason: "rig: a commit inside the watcher's read", Desired: desired}
	t0 := time.Now()
	r.Drop(ctx, req)
	s := r.WaitStatus(ctx, req.ID, 5*time.Minute)
	r.LogStatus("repave committed inside the watcher's read", s)
	if s.Phase != requests.Succeeded || s.ActiveSlot != to {
		t.Fatalf("repave: %s on %q: %s, want Succeeded on %s", s.Phase, s.ActiveSlot, s.Message, to)
	}
	r.WaitIdle(ctx, time.Minute)
	// The held read named the old slot; its configuration is gone now.
	r.Sh(ctx, "test ! -e /opt/kubeslot/applied/"+from+".json && test \"$(cat /opt/kubeslot/applied/active)\" = "+to)
	if held() != h0+1 || released() != rel0 {
		t.Fatalf("the watcher's read was not held across the whole repave (held %d times, released %d times)", held()-h0, released()-rel0)
	}
	r.Sh(ctx, "rm "+gate)
	rig.Eventually(t, time.Minute, "the held read released", func() (bool, string) { return released() > rel0, r.WatcherTail(ctx) })
	rig.Eventually(t, 2*time.Minute, "the watcher reports the target slot", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return slot == to, fmt.Sprintf("active slot %q after %d versions", slot, versions)
	})
	mu.Lock()
	defer mu.Unlock()
	t.Logf("Machine versions watched across the repave: %d", versions)
	if len(degraded) > 0 {
		t.Errorf("the watcher published Degraded=True during the commit:\n%s\n%s", strings.Join(degraded, "\n"), r.WatcherTail(ctx))
	}
	rig.WaitNodeHeartbeat(t, ctx, r.Admin, r.Node, t0, 2*time.Minute, r.H)
}

// healSlowVersion: after an agent upgrade the host runs release green (current) with blue
// kept as last-good. One binary of green answers --version only after 8 s on its first call after the power cut
// (a wrapper script; release.Ensure gives each answer 5 s), as a busy host at boot does. The bootstrap unit's run at
// boot must leave both releases and both links alone. Then the watcher is back (from green), the node runs, and a
// later bootstrap run, with the answer now quick, changes nothing. What it guards against: a slow answer taken as
// current "not usable", so that Ensure installs the running binary's directory (green, quick by then) over blue,
// the only fallback, and points both links at the copy. Since the boot-time run repairs only what lib/verify names, a
// current that verifies is not handed to release.Ensure at boot at all; Ensure's own refusal of a slow answer is
// TestEnsureKeepsTheFallback (lib/release).
func healSlowVersion(t *testing.T, ctx context.Context, r *rig.RepaveRig) {
	slot, _ := r.Active()
	r.Sh(ctx, `set -e
cd /opt/kubeslot
test "$(readlink current)" = releases/blue
rm -rf releases/green && cp -a releases/blue releases/green
echo kept > releases/blue/rig-last-good
mkdir -p /var/lib/kubeslot-rig && rm -f /var/lib/kubeslot-rig/slow-done
mv releases/green/kubeslot /var/lib/kubeslot-rig/kubeslot
cat >releases/green/kubeslot <<'EOF'
#!/bin/sh
# rig: the first --version after the power cut answers after 8 s (release.Ensure waits 5 s).
if [ "$1" = --version ] && [ ! -e /var/lib/kubeslot-rig/slow-done ]; then
	touch /var/lib/kubeslot-rig/slow-done
	sleep 8
fi
exec /var/lib/kubeslot-rig/kubeslot "$@"
EOF
chmod 755 releases/green/kubeslot
ln -sfn releases/blue .rig-last-good && mv -T .rig-last-good last-good
ln -sfn releases/green .rig-current && mv -T .rig-current current
sync`)
	links := func() string {
		return strings.TrimSpace(r.Sh(ctx, "cd /opt/kubeslot && echo current=$(readlink current) last-good=$(readlink last-good)"))
	}
	const want = "current=releases/green last-good=releases/blue"
	if got := links(); got != want {
		t.Fatalf("links before the power cut: %s", got)
	}
	if err := r.H.Kill(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := r.H.Boot(ctx); err != nil {
		t.Fatalf("boot after the power cut: %v", err)
	}
	rig.Eventually(t, 3*time.Minute, "the bootstrap unit's run at boot finished on the complete host", func() (bool, string) {
		j, _ := r.H.Run(ctx, "journalctl", "-b", "-q", "-o", "cat", "-u", units.Bootstrap)
		return strings.Contains(string(j), `bootstrap run finished stage="kubeslot-bootstrap" decision="complete"`), rig.TailLines(string(j), 10)
	})
	rig.Timing(t, "slow --version: power cut to the bootstrap's boot-time run", time.Since(t0))
	check := func(when string) {
		t.Helper()
		if got := links(); got != want {
			t.Errorf("%s: links %s, want %s", when, got, want)
		}
		if _, err := r.H.Run(ctx, "test", "-e", "/opt/kubeslot/releases/blue/rig-last-good"); err != nil {
			t.Errorf("%s: the last-good release blue was replaced (its marker is gone)", when)
		}
		r.Sh(ctx, "for b in /opt/kubeslot/current/kubeslot* /opt/kubeslot/last-good/kubeslot*; do $b --version >/dev/null || exit 1; done")
	}
	check("after the slow answer at boot")
	waitWatcherActive(t, ctx, r.Rig)
	if exe := r.Sh(ctx, "readlink /proc/$(systemctl show -p MainPID --value "+units.Watcher+")/exe"); !strings.Contains(exe, "releases/green/") {
		t.Errorf("the watcher runs %s, want release green's", exe)
	}
	if out, err := r.H.Run(ctx, "systemctl", "is-active", "systemd-nspawn@"+slot+".service"); err != nil {
		t.Errorf("the node of slot %s is not running after the boot: %v %s", slot, err, out)
	}
	rig.WaitNodeHeartbeat(t, ctx, r.Admin, r.Node, t0, 3*time.Minute, r.H)
	rig.Timing(t, "slow --version: power cut to Node Ready", time.Since(t0))
	// A later run checks again, and now the answer is quick (started at once, not after the unit's RestartSec=).
	r.Sh(ctx, "systemctl stop "+units.Bootstrap)
	if err := r.StartUnit(ctx); err != nil {
		t.Errorf("the bootstrap unit's next run: %v", err)
	}
	check("after the next bootstrap run")
}

// healResetStepFails: an AgentReset whose remove-rootfs step fails on the host: a tmpfs is
// mounted inside the active slot's tree (as a person's or a leftover mount would be), which the step refuses to
// remove under. The operation must end Failed with a message naming the step, the ownership record stays
// "resetting", and the host root, the ownership record and the slot's tree are still there. What it guards
// against: a reset that reports Succeeded before its steps run, so that the operation says Succeeded on a host left
// half reset. The
// test looks only at the operation, the host's files and the record, not at which unit runs the resetter.
func healResetStepFails(t *testing.T, ctx context.Context, r *rig.RepaveRig) {
	slot, _ := r.Active()
	busy := "/var/lib/machines/" + slot + "/rig-busy"
	r.Sh(ctx, "mkdir -p "+busy+" && mount -t tmpfs rig-busy "+busy)
	op := createResetOperation(t, ctx, r.Rig)
	t0 := time.Now()
	var msg string
	rsEventually(t, ctx, 3*time.Minute, "the AgentReset operation finished for the Machine", func() (bool, string) {
		got, err := r.MC.GetOperation(ctx, op)
		if err != nil {
			return false, err.Error()
		}
		if e := got.Status.Target(r.Node, r.Node); e != nil {
			msg = e.Message
			return e.Phase == "Succeeded" || e.Phase == "Failed", string(e.Phase) + ": " + e.Message
		}
		return false, "no entry"
	})
	rig.Timing(t, "reset: AgentReset with a failing step to its Failed result", time.Since(t0))
	got, err := r.MC.GetOperation(ctx, op)
	if err != nil {
		t.Fatal(err)
	}
	e := got.Status.Target(r.Node, r.Node)
	t.Logf("operation %s: %s: %s", op, e.Phase, e.Message)
	if e.Phase != "Failed" || !strings.Contains(msg, "remove-rootfs") {
		t.Errorf("operation %s ended %s (%q), want Failed naming the step remove-rootfs", op, e.Phase, msg)
	}
	if rec, err := r.Record(); err != nil || rec.Checkpoint != "resetting" {
		t.Errorf("ownership record after the failed reset: %+v %v, want checkpoint resetting", rec, err)
	}
	for _, p := range []string{"/opt/kubeslot/ownership.json", "/opt/kubeslot/applied/active", busy} {
		if out, err := r.H.Run(ctx, "test", "-e", p); err != nil {
			t.Errorf("%s gone after a reset that failed at remove-rootfs: %v %s", p, err, out)
		}
	}
	// The request was finished with its result: nothing retries the failure unattended.
	r.Sh(ctx, "test ! -e /opt/kubeslot/requests/reset.json && test ! -e /opt/kubeslot/state/claimed-reset.json")
	_, _ = r.H.Run(ctx, "umount", busy)
}
