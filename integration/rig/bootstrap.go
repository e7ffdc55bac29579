package rig

import (
	"context"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/units"
)

// CheckComplete: the Node Ready from slot a, the Machine condition, units installed and enabled, the node enabled
// at boot, `kubeslot status` complete on slot a, the watcher started if this release has one.
func (r *Rig) CheckComplete(ctx context.Context, t0 time.Time) {
	t := r.t
	t.Helper()
	n := WaitNodeHeartbeat(t, ctx, r.Admin, r.Node, time.Time{}, 3*time.Minute, r.H)
	CheckNodeSettings(t, n)
	m, err := r.MC.GetMachine(ctx, r.Node)
	if err != nil {
		t.Fatalf("Machine: %v", err)
	}
	c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.ConditionAgentBootstrapped)
	if c == nil || c.Status != "True" || m.Status.ActiveSlot != "a" || m.Spec.NodeName != r.Node {
		t.Errorf("Machine %s: AgentBootstrapped %+v, activeSlot %q, nodeName %q", r.Node, c, m.Status.ActiveSlot, m.Spec.NodeName)
	}
	for _, p := range []string{"/etc/systemd/system/" + units.Bootstrap,
		"/etc/systemd/system/multi-user.target.wants/" + units.Bootstrap,
		"/etc/systemd/system/machines.target.wants/systemd-nspawn@a.service"} {
		if out, err := r.H.Run(ctx, "test", "-e", p); err != nil {
			t.Errorf("%s missing: %v %s", p, err, out)
		}
	}
	if out, err := r.H.Run(ctx, "systemctl", "is-enabled", "systemd-nspawn@a.service"); err != nil || strings.TrimSpace(string(out)) != "enabled" {
		t.Errorf("systemd-nspawn@a not enabled at boot: %v %s", err, out)
	}
	// Joined: the join token is gone from the configuration file and from the slot, the rest of the file kept.
	if cfg, err := r.H.ReadFile(ConfigPath); err != nil || r.Token == "" || strings.Contains(string(cfg), r.Token) ||
		!strings.Contains(string(cfg), "# bootstrap_token removed by kubeslot-bootstrap") {
		t.Errorf("%s after the join (want the token replaced by the bootstrap's comment): %v\n%s", ConfigPath, err, cfg)
	}
	if kc, err := r.H.ReadFile("/var/lib/machines/a/etc/kubernetes/bootstrap-kubelet.conf"); err != nil || strings.Contains(string(kc), r.Token) {
		t.Errorf("slot a's bootstrap kubeconfig keeps the join token after the join: %v", err)
	}
	out, err := r.H.Run(ctx, "/opt/kubeslot/current/kubeslot", "status")
	if err != nil || !strings.Contains(string(out), "complete") || !strings.Contains(string(out), "Active slot:") ||
		!strings.Contains(string(out), "a (nspawn mode") {
		t.Errorf("kubeslot status: %v\n%s", err, out)
	}
	all, err := units.All(units.Vars{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := all["kubeslot-watcher.service"]; ok {
		out, _ := r.H.Run(ctx, "systemctl", "show", "-p", "ExecMainStartTimestampMonotonic", "kubeslot-watcher.service")
		if strings.TrimSpace(string(out)) == "ExecMainStartTimestampMonotonic=0" {
			t.Errorf("the watcher was never started: %s", out)
		}
	} else {
		t.Logf("this release has no kubeslot-watcher.service yet: not checking that it started")
	}
	Timing(t, "bootstrap: start to Node Ready and Machine reported", time.Since(t0))
}
