package bootstrap

// The host-root migration on the rig: an installation laid down and bootstrapped under the rig's
// /opt/kubeslot is moved to another base by the next bootstrap run given that base, while its node keeps serving;
// then the moved installation is verified, repaved and reset, and nothing is left at either base.

import (
	"context"
	"path"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/units"
)

// mgNewBase's parent does not exist on the rig host: the move makes it, and
// the reset removes it.
const mgNewBase = "/opt/moved/kubeslot"

func TestHostRootMigrationOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	r := rig.NewRepaveRig(t, ctx, "mg", false)
	show := func(unit string, props ...string) string {
		args := []string{"systemctl", "show", unit}
		for _, p := range props {
			args = append(args, "-p", p)
		}
		out, err := r.H.Run(ctx, args...)
		if err != nil {
			t.Fatalf("systemctl show %s: %v\n%s", unit, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	node := func() string {
		return show("systemd-nspawn@a.service", "MainPID", "InvocationID", "NRestarts", "ActiveState")
	}
	// last-good as an agent upgrade leaves it (a release Ignition laid down has none until the first upgrade), so
	// that the recovery unit has a release to run after the move.
	if out, err := r.H.Run(ctx, "ln", "-sfn", "releases/blue", "/opt/kubeslot/last-good"); err != nil {
		t.Fatalf("last-good: %v\n%s", err, out)
	}
	before := node()
	if !strings.Contains(before, "ActiveState=active") {
		t.Fatalf("node machine before the move: %s", before)
	}

	// The next bootstrap run, given the new base: it finds the installation through the installed units and moves
	// it. Run from the rig's copy of the binaries, as a boot-time unit of a new release would be.
	t0 := time.Now()
	out, err := r.H.Run(ctx, append(append([]string{"env"}, r.Env...), rig.BinsPath+"/kubeslot-bootstrap",
		"--host-root", mgNewBase, "--config", rig.ConfigPath)...)
	took := time.Since(t0)
	if err != nil {
		j, _ := r.H.Journal(ctx, units.Watcher)
		t.Fatalf("migrating bootstrap run: %v\n%s\nwatcher journal:\n%s\n%s", err, out, rig.TailLines(j, 40), rig.HostDiag(r.H))
	}
	t.Logf("migrating bootstrap run:\n%s", rig.TailLines(string(out), 30))
	rig.Timing(t, "host-root migration: bootstrap run that moved the installation", took)
	for _, want := range []string{"installation moved to the configured host root", "complete installation"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the migrating run does not say %q", want)
		}
	}

	// The node machine was never restarted: same main PID, same invocation, no restart.
	if after := node(); after != before {
		t.Errorf("node machine restarted by the move: before %q, after %q", before, after)
	}
	for _, p := range []string{"/opt/kubeslot", mgNewBase + "/state/migration.json"} {
		if out, err := r.H.Run(ctx, "test", "!", "-e", p); err != nil {
			t.Errorf("%s still there after the move: %s", p, out)
		}
	}
	for _, p := range []string{mgNewBase + "/ownership.json", mgNewBase + "/layout-version", mgNewBase + "/current/kubeslot-watcher"} {
		if out, err := r.H.Run(ctx, "test", "-e", p); err != nil {
			t.Errorf("%s missing after the move: %s", p, out)
		}
	}
	// The units name the new base, the watcher runs from it, nothing kubeslot wrote names the old one.
	if w := show(units.Watcher, "ExecStart", "ActiveState"); !strings.Contains(w, mgNewBase+"/current/kubeslot-watcher") || !strings.Contains(w, "ActiveState=active") {
		t.Errorf("watcher after the move: %s", w)
	}
	if out, _ := r.H.Run(ctx, "sh", "-c", "grep -rlE '/opt/kubeslot(/|$|[[:space:]:])' /etc/systemd/system/kubeslot-* /etc/systemd/nspawn /etc/systemd/system/systemd-nspawn@*.service.d /opt/kubeslot-moved/ownership.json 2>/dev/null; true"); strings.TrimSpace(string(out)) != "" {
		t.Errorf("files still naming the old base: %s", out)
	}
	// The node kept serving: its kubelet renews its Lease after the move, and the Node stays Ready.
	mgWaitLeaseRenewed(t, ctx, r, time.Now(), 90*time.Second)

	// kubeslot verify on the moved installation.
	if out, err := r.H.Run(ctx, mgNewBase+"/current/kubeslot", "--host-root", mgNewBase, "verify"); err != nil {
		t.Errorf("kubeslot verify after the move: %v\n%s", err, out)
	}

	// The rollback path works on the moved tree: the recovery unit runs last-good's upgrader from the new base (a
	// layout-1 release on a tree still at layout 1) and, current being last-good, changes nothing.
	watcherPID := show(units.Watcher, "MainPID")
	if out, err := r.H.Run(ctx, "systemctl", "start", "kubeslot-recovery.service"); err != nil {
		j, _ := r.H.Journal(ctx, "kubeslot-recovery.service")
		t.Errorf("recovery unit after the move: %v\n%s\n%s", err, out, rig.TailLines(j, 20))
	}
	if res := show("kubeslot-recovery.service", "Result", "ExecMainStatus", "ExecStart"); !strings.Contains(res, "Result=success") ||
		!strings.Contains(res, "ExecMainStatus=0") || !strings.Contains(res, mgNewBase+"/last-good/kubeslot-upgrader") {
		t.Errorf("recovery unit after the move: %s", res)
	}
	if got := show(units.Watcher, "MainPID"); got != watcherPID {
		t.Errorf("the recovery unit restarted the watcher with current at last-good: %s, then %s", watcherPID, got)
	}

	// A repave of the moved installation, by hand (the rig's environment, as its worker drop-ins give it).
	t1 := time.Now()
	out, err = r.H.Run(ctx, append(append([]string{"env"}, r.Env...), mgNewBase+"/current/kubeslot-repaver", "--host-root", mgNewBase, "b")...)
	if err != nil {
		t.Fatalf("repave after the move: %v\n%s\n%s", err, rig.TailLines(string(out), 40), rig.HostDiag(r.H))
	}
	rig.Timing(t, "host-root migration: repave a->b of the moved installation", time.Since(t1))
	if b, err := r.H.ReadFile(mgNewBase + "/applied/active"); err != nil || strings.TrimSpace(string(b)) != "b" {
		t.Errorf("active slot after the repave: %q %v", b, err)
	}
	rig.WaitNodeHeartbeat(t, ctx, r.Admin, r.Node, t1, 2*time.Minute, r.H)

	// A reset removes everything: nothing at either base, no kubeslot unit, no machine.
	out, err = r.H.Run(ctx, mgNewBase+"/current/kubeslot-resetter", "--host-root", mgNewBase, "--yes")
	if err != nil || !strings.Contains(string(out), "kubeslot removed from this host") {
		t.Fatalf("reset after the move: %v\n%s", err, rig.TailLines(string(out), 40))
	}
	for _, p := range append([]string{mgNewBase, path.Dir(mgNewBase), "/var/lib/machines/b", "/etc/systemd/nspawn/b.nspawn"}, rig.ResetGone...) {
		if out, err := r.H.Run(ctx, "test", "!", "-e", p); err != nil {
			t.Errorf("%s still there after the reset: %s", p, out)
		}
	}
	// The rig's own drop-ins (rig.conf) are not kubeslot's: they stay.
	out, _ = r.H.Run(ctx, "sh", "-c", "ls /etc/systemd/system | grep kubeslot; true")
	if got, want := strings.Fields(string(out)), []string{units.Bootstrap + ".d", "kubeslot-repave@.service.d", "kubeslot-restart.service.d"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("kubeslot entries left in /etc/systemd/system: %v, want only the rig's drop-ins %v", got, want)
	}
	if out, err := r.H.Run(ctx, "machinectl", "list", "--no-legend"); err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("machines after the reset: %v %q", err, out)
	}
}

// mgWaitLeaseRenewed waits (bounded) until the node's Lease was renewed after since, with its Node Ready: the kubelet
// is alive and talking to the cluster. (The Node's Ready heartbeat itself changes only every few minutes when nothing
// else does.)
func mgWaitLeaseRenewed(t *testing.T, ctx context.Context, r *rig.RepaveRig, since time.Time, bound time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bound)
	last := "no Lease read"
	for time.Now().Before(deadline) {
		lease, err := r.Admin.CoordinationV1().Leases("kube-node-lease").Get(ctx, r.Node, metav1.GetOptions{})
		n, nerr := r.Admin.CoreV1().Nodes().Get(ctx, r.Node, metav1.GetOptions{})
		switch {
		case err != nil || nerr != nil:
			last = "lease: " + mgErrString(err) + "; node: " + mgErrString(nerr)
		case lease.Spec.RenewTime == nil:
			last = "lease without renewTime"
		default:
			ready := false
			for _, c := range n.Status.Conditions {
				ready = ready || (c.Type == "Ready" && c.Status == "True")
			}
			if lease.Spec.RenewTime.After(since) && ready {
				t.Logf("node Lease renewed at %s, %s after the move; Node Ready", lease.Spec.RenewTime.Format(time.RFC3339), lease.Spec.RenewTime.Sub(since).Round(time.Second))
				return
			}
			last = "lease renewed " + lease.Spec.RenewTime.Format(time.RFC3339) + ", ready " + map[bool]string{true: "True", false: "not True"}[ready]
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(2 * time.Second):
		}
	}
	t.Fatalf("node %s Lease not renewed after %s with the Node Ready within %s (%s)\n%s", r.Node, since.Format(time.RFC3339), bound, last, rig.HostDiag(r.H))
}

func mgErrString(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}
