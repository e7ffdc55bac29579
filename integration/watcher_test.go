package integration

// The watcher stage on the rig: the real binary under its real unit in an isolated host, against the rig's control
// plane, acting as the node (system:node:<name>). The subtests run in order on one host, each building on the last.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeslot/kubeslot/integration/kube"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/watcher"
	"github.com/kubeslot/kubeslot/units"
)

func TestWatcherOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	r := newWatcherRig(t, ctx, "wat")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("watcher journal:\n%s", r.journal())
		}
	})
	getMachine := func() *v1alpha1.Machine {
		m, err := r.admin.GetMachine(ctx, r.node)
		if err != nil {
			return nil
		}
		return m
	}
	// updateSpec changes the Machine as an admin would, again on a conflict with the watcher's status writes.
	updateSpec := func(t *testing.T, change func(*v1alpha1.Machine)) int64 {
		t.Helper()
		for attempt := 1; ; attempt++ {
			m := getMachine()
			change(m)
			out, err := r.admin.UpdateMachine(ctx, m)
			if err == nil {
				return out.Generation
			}
			if !apierrors.IsConflict(errors.Unwrap(err)) && !apierrors.IsConflict(err) || attempt == 10 {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	t.Run("DeferredWhileInstallationIncomplete", func(t *testing.T) {
		if res := r.start(units.Watcher); res != "done" {
			t.Errorf("start job: %s, want done (exit %d is success)", res, exitcode.Deferred)
		}
		time.Sleep(time.Second) // several RestartSec=300ms: a restart, if any, would have happened
		want := fmt.Sprintf("ActiveState=inactive SubState=dead Result=success NRestarts=0 ExecMainStatus=%d", exitcode.Deferred)
		if got := unitState(t, ctx, r.sd, units.Watcher); got != want {
			t.Errorf("unit: %s, want %s", got, want)
		}
		if j := r.journal(); strings.Contains(j, "failed") || !strings.Contains(j, "deferred") {
			t.Errorf("want a deferral line and no error line in the journal:\n%s", j)
		}
	})

	r.complete()
	t.Run("StartsRegistersAndReports", func(t *testing.T) {
		t0 := time.Now()
		if res := r.start(units.Watcher); res != "done" {
			t.Fatalf("start job: %s", res)
		}
		rigTiming(t, "watcher start -> READY", time.Since(t0))
		eventually(t, 30*time.Second, "Machine registered and reported Ready", func() (bool, string) {
			m := getMachine()
			if m == nil {
				return false, "no Machine"
			}
			return m.Spec.NodeName == r.node && m.Status.Phase == v1alpha1.MachineReady && m.Status.ActiveSlot == "a" &&
				m.Status.Applied != nil && string(m.Status.Applied.Fingerprint) == r.applied.Fingerprint(), fmt.Sprintf("%+v", m.Status)
		})
	})

	t.Run("SpecChangeGivesOneRepave", func(t *testing.T) {
		var lat []time.Duration
		var gen int64
		for i := 0; i < 5; i++ {
			gen = updateSpec(t, func(m *v1alpha1.Machine) {
				m.Spec.UpdatePolicy = v1alpha1.UpdateImmediate
				m.Spec.Node.KubernetesVersion = fmt.Sprintf("1.99.%d", i)
			})
			want := requests.NewID(requests.Repave, gen, "")
			d := eventually(t, 20*time.Second, "repave request "+want, func() (bool, string) {
				id := r.pendingID(requests.Repave)
				return id == want, id
			})
			lat = append(lat, d)
		}
		slices.Sort(lat)
		t.Logf("spec change -> request file: min %v median %v max %v over %d changes", lat[0], lat[len(lat)/2], lat[len(lat)-1], len(lat))
		figures.Add("watcher: spec change -> repave request (median)", lat[len(lat)/2])
		// A worker claims it; an update that changes no spec (a label) must not bring a second request.
		req := r.claim(requests.Repave)
		if req.Desired == nil || req.Desired.Kubernetes.Version != "1.99.4" || req.MachineGeneration != gen {
			t.Errorf("claimed request: %+v", req)
		}
		updateSpec(t, func(m *v1alpha1.Machine) { m.Labels = map[string]string{"touched": "yes"} })
		time.Sleep(2 * time.Second)
		if id := r.pendingID(requests.Repave); id != "" {
			t.Errorf("a second repave request %s after a no-op change", id)
		}
		// The repave "fails" (the fake worker says so): it is reported, and not requested again.
		if err := r.dir.WriteStatus(&requests.Status{RequestID: req.ID, Kind: requests.Repave, MachineGeneration: gen,
			Phase: requests.Failed, Message: "test: rootfs unreachable"}); err != nil {
			t.Fatal(err)
		}
		os.Remove(mustOK(r.dir.ClaimedPath(requests.Repave)))
		eventually(t, 20*time.Second, "Repaved=False on the Machine", func() (bool, string) {
			m := getMachine()
			c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.ConditionRepaved)
			return c != nil && c.Status == metav1.ConditionFalse && strings.Contains(c.Message, "rootfs unreachable"), fmt.Sprintf("%+v", c)
		})
		time.Sleep(time.Second)
		if id := r.pendingID(requests.Repave); id != "" {
			t.Errorf("failed repave requested again: %s", id)
		}
	})

	var restartOp string
	t.Run("NodeRestartOperation", func(t *testing.T) {
		op := &v1alpha1.MachineOperation{Spec: v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationNodeRestart,
			MachineRef: &v1alpha1.MachineReference{Name: r.node}}}
		op.Name = r.node + "-restart"
		other := &v1alpha1.MachineOperation{Spec: v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationNodeRestart,
			MachineRef: &v1alpha1.MachineReference{Name: r.node + "-other"}}}
		other.Name = r.node + "-other-restart"
		for _, o := range []*v1alpha1.MachineOperation{other, op} {
			if _, err := r.admin.CreateOperation(ctx, o); err != nil {
				t.Fatal(err)
			}
			name := o.Name
			t.Cleanup(func() { _ = r.admin.DeleteOperation(context.Background(), name) })
		}
		restartOp = op.Name
		var id string
		eventually(t, 20*time.Second, "restart request", func() (bool, string) {
			id = r.pendingID(requests.Restart)
			return strings.HasSuffix(id, "-"+op.Name), id
		})
		req := r.claim(requests.Restart)
		for _, ph := range []requests.Phase{requests.InProgress, requests.Succeeded} {
			if err := r.dir.WriteStatus(&requests.Status{RequestID: req.ID, Kind: requests.Restart, Operation: op.Name,
				MachineGeneration: req.MachineGeneration, Phase: ph, Message: "test worker: " + string(ph),
				Phases: []requests.PhaseTiming{{Name: "restart", StartedAt: time.Now().UTC()}}}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond)
		}
		eventually(t, 20*time.Second, "operation entry Succeeded", func() (bool, string) {
			got, err := r.admin.GetOperation(ctx, op.Name)
			if err != nil {
				return false, err.Error()
			}
			e := got.Status.Target(r.node, r.node)
			return e != nil && e.Phase == v1alpha1.OperationSucceeded && got.Status.Phase == v1alpha1.OperationSucceeded, fmt.Sprintf("%+v", got.Status)
		})
		if got, _ := r.admin.GetOperation(ctx, other.Name); got != nil && len(got.Status.Machines) > 0 {
			t.Errorf("operation for another machine got an entry: %+v", got.Status)
		}
		cs, err := kubernetes.NewForConfig(r.cp.AdminConfig())
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 20*time.Second, "Events on the Machine", func() (bool, string) {
			l, err := cs.CoreV1().Events(watcher.EventNamespace).List(ctx, metav1.ListOptions{
				FieldSelector: fields.OneTermEqualSelector("involvedObject.name", r.node).String()})
			if err != nil {
				return false, err.Error()
			}
			var reasons []string
			for _, e := range l.Items {
				if e.InvolvedObject.Kind == "Machine" && e.Type == corev1.EventTypeNormal {
					reasons = append(reasons, e.Reason)
				}
			}
			return slices.Contains(reasons, "RequestSucceeded"), strings.Join(reasons, ",")
		})
		os.Remove(mustOK(r.dir.ClaimedPath(requests.Restart)))
	})

	t.Run("Kill9RestartsWithoutDuplicates", func(t *testing.T) {
		before := r.svc("NRestarts").(uint32)
		pid := r.svc("MainPID").(uint32)
		t.Logf("watcher RSS before kill: %s", r.rss())
		r.run("systemctl", "kill", "--signal=SIGKILL", units.Watcher)
		eventually(t, 30*time.Second, "watcher restarted", func() (bool, string) {
			s := unitState(t, ctx, r.sd, units.Watcher)
			return r.svc("NRestarts").(uint32) > before && r.svc("MainPID").(uint32) != pid && strings.HasPrefix(s, "ActiveState=active"), s
		})
		time.Sleep(3 * time.Second)
		for _, k := range requests.Kinds() {
			if id := r.pendingID(k); id != "" {
				t.Errorf("request %s written again after kill -9", id)
			}
		}
		_ = restartOp
	})

	t.Run("Figures", func(t *testing.T) {
		// API requests other than watches while idle, from the apiserver's own counters (the test makes none).
		cs, err := kubernetes.NewForConfig(r.cp.AdminConfig())
		if err != nil {
			t.Fatal(err)
		}
		count := func() float64 {
			b, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var n float64
			for _, l := range strings.Split(string(b), "\n") {
				if !strings.HasPrefix(l, "apiserver_request_total{") || strings.Contains(l, `verb="WATCH"`) ||
					!(strings.Contains(l, `resource="machines"`) || strings.Contains(l, `resource="machineoperations"`)) {
					continue
				}
				var v float64
				fmt.Sscan(l[strings.LastIndex(l, " ")+1:], &v)
				n += v
			}
			return n
		}
		time.Sleep(2 * time.Second) // let the restart's first sync settle
		c0 := count()
		time.Sleep(15 * time.Second)
		idle := count() - c0
		t.Logf("Machine/MachineOperation API requests (not watches) in 15 s idle: %.0f", idle)
		fmt.Printf("rig: watcher idle API requests in 15 s: %.0f\n", idle)

		// Spec change -> request file, polled every 2 ms.
		var lat []time.Duration
		for i := 0; i < 20; i++ {
			t0 := time.Now()
			gen := updateSpec(t, func(m *v1alpha1.Machine) { m.Spec.Node.KubernetesVersion = fmt.Sprintf("1.98.%d", i) })
			want := requests.NewID(requests.Repave, gen, "")
			for r.pendingID(requests.Repave) != want {
				if time.Since(t0) > 20*time.Second {
					t.Fatalf("no request %s", want)
				}
				time.Sleep(2 * time.Millisecond)
			}
			lat = append(lat, time.Since(t0))
		}
		slices.Sort(lat)
		t.Logf("spec update sent -> request file (20 changes): min %v median %v p95 %v max %v", lat[0], lat[10], lat[18], lat[19])
		figures.Add("watcher: spec update -> request file, p95 of 20", lat[18])
		req := r.claim(requests.Repave)
		if err := r.dir.WriteStatus(&requests.Status{RequestID: req.ID, Kind: requests.Repave, MachineGeneration: req.MachineGeneration,
			Phase: requests.Succeeded, Message: "test worker"}); err != nil {
			t.Fatal(err)
		}
		os.Remove(mustOK(r.dir.ClaimedPath(requests.Repave)))
		t.Logf("watcher RSS: %s", r.rss())
	})

	t.Run("ReexecOnCurrentFlip", func(t *testing.T) {
		pid := r.svc("MainPID").(uint32)
		restarts := r.svc("NRestarts").(uint32)
		r.run("sh", "-c", "ln -sfn releases/green /opt/kubeslot/current.new && mv -T /opt/kubeslot/current.new /opt/kubeslot/current")
		t0 := time.Now()
		eventually(t, 30*time.Second, "Machine agentVersion "+greenVersion, func() (bool, string) {
			m := getMachine()
			return m != nil && m.Status.AgentVersion == greenVersion, m.Status.AgentVersion
		})
		rigTiming(t, "current flip -> new watcher version reported", time.Since(t0))
		if got := r.svc("MainPID").(uint32); got != pid {
			t.Errorf("MainPID %d -> %d: want the same process re-executed", pid, got)
		}
		if got := r.svc("NRestarts").(uint32); got != restarts {
			t.Errorf("NRestarts %d -> %d: the unit restarted instead of re-executing", restarts, got)
		}
		if s := unitState(t, ctx, r.sd, units.Watcher); !strings.HasPrefix(s, "ActiveState=active") {
			t.Errorf("unit after re-exec: %s", s)
		}
		t.Logf("watcher RSS after re-exec: %s", r.rss())
		fmt.Printf("rig: watcher RSS %s\n", r.rss())
	})

	t.Run("ClusterUnreachableAtStart", func(t *testing.T) {
		kc, err := r.h.ReadFile("/opt/kubeslot/identity/kubeconfig")
		if err != nil {
			t.Fatal(err)
		}
		ports, err := kube.FreePorts(1)
		if err != nil {
			t.Fatal(err)
		}
		closed := strings.Replace(string(kc), r.cp.URL(), fmt.Sprintf("https://127.0.0.1:%d", ports[0]), 1)
		if closed == string(kc) {
			t.Fatal("kubeconfig does not name the apiserver URL")
		}
		r.run("systemctl", "stop", units.Watcher)
		if err := r.h.WriteFile("/opt/kubeslot/identity/kubeconfig", []byte(closed), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := r.h.WriteFile("/etc/systemd/system/"+units.Watcher+".d/zz-ready.conf",
			[]byte("[Service]\nEnvironment=KUBESLOT_WATCHER_READY_AFTER=2s\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		r.run("systemctl", "daemon-reload")
		t0 := time.Now()
		if res := r.start(units.Watcher); res != "done" {
			t.Fatalf("start with the cluster unreachable: job %s", res)
		}
		rigTiming(t, "watcher start, cluster unreachable -> READY", time.Since(t0))
		// While it cannot reach the cluster the spec moves on; nothing may be dispatched from what it saw before.
		gen := updateSpec(t, func(m *v1alpha1.Machine) {
			m.Spec.UpdatePolicy = v1alpha1.UpdateImmediate
			m.Spec.Node.KubernetesVersion = "1.99.7"
		})
		time.Sleep(3 * time.Second)
		if s := unitState(t, ctx, r.sd, units.Watcher); !strings.HasPrefix(s, "ActiveState=active") {
			t.Errorf("watcher without a cluster: %s, want it running", s)
		}
		if id := r.pendingID(requests.Repave); id != "" {
			t.Errorf("request %s dispatched while the cluster was unreachable", id)
		}
		t1 := time.Now()
		if err := r.h.WriteFile("/opt/kubeslot/identity/kubeconfig", kc, 0o600); err != nil {
			t.Fatal(err)
		}
		want := requests.NewID(requests.Repave, gen, "")
		eventually(t, 60*time.Second, "repave "+want+" after the cluster came back", func() (bool, string) {
			id := r.pendingID(requests.Repave)
			return id == want, id
		})
		rigTiming(t, "kubeconfig restored -> request for the current spec", time.Since(t1))
		req := r.claim(requests.Repave)
		if err := r.dir.WriteStatus(&requests.Status{RequestID: req.ID, Kind: requests.Repave, MachineGeneration: gen,
			Phase: requests.Succeeded, Message: "test worker"}); err != nil {
			t.Fatal(err)
		}
		os.Remove(mustOK(r.dir.ClaimedPath(requests.Repave)))
	})

	t.Run("InvalidSpecDegraded", func(t *testing.T) {
		// The schema accepts this label; the agent's own check does not (the kubelet may not set it on its Node).
		const key = "node-role.kubernetes.io/worker"
		gen := updateSpec(t, func(m *v1alpha1.Machine) {
			m.Spec.Node.Labels = map[string]v1alpha1.LabelValue{key: "x"}
			m.Spec.Node.KubernetesVersion = "1.99.8"
		})
		eventually(t, 20*time.Second, "Degraded InvalidSpec naming the field", func() (bool, string) {
			m := getMachine()
			c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.ConditionDegraded)
			return c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonInvalidSpec &&
				strings.Contains(c.Message, "spec.node.labels") && strings.Contains(c.Message, key) &&
				m.Status.Phase == v1alpha1.MachineDegraded, fmt.Sprintf("%+v", c)
		})
		time.Sleep(time.Second)
		if id := r.pendingID(requests.Repave); id != "" {
			t.Errorf("repave %s dispatched from an invalid spec (generation %d)", id, gen)
		}
		m := getMachine()
		t.Logf("Degraded: %s", meta.FindStatusCondition(m.Status.Conditions, v1alpha1.ConditionDegraded).Message)
	})

	t.Run("CorruptAppliedConfigRefuses", func(t *testing.T) {
		p := mustOK(r.root.Path("applied", "a.json"))
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, append(b, ' '), 0o600); err != nil {
			t.Fatal(err)
		}
		gen := updateSpec(t, func(m *v1alpha1.Machine) { m.Spec.Node.KubernetesVersion = "1.99.9" })
		eventually(t, 30*time.Second, "Degraded condition naming the applied config", func() (bool, string) {
			m := getMachine()
			c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.ConditionDegraded)
			return c != nil && c.Status == metav1.ConditionTrue && c.Reason == watcher.ReasonAppliedCorrupt &&
				strings.Contains(c.Message, "a.json"), fmt.Sprintf("%+v", c)
		})
		time.Sleep(time.Second)
		if id := r.pendingID(requests.Repave); id != "" {
			t.Errorf("repave %s dispatched from a corrupt applied config (generation %d)", id, gen)
		}
	})
}

func mustOK[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
