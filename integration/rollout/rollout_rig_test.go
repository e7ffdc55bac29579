package rollout

// TestRolloutOnRig: a paced rollout proved on real hosts. Three rig hosts, each a real
// kubeslot installation whose node runs pods (rig.NewPodsRig), with the real watcher and repaver units and the node's own
// identity, joined to the package's one control plane. A Deployment of three with a readiness probe and a
// PodDisruptionBudget maxUnavailable 1 runs spread over them; a stand-in scheduler places pods (spreadScheduler).
// What is watched the whole time (rolloutSampler, every 100 ms): how many nodes are disrupted at once (cordoned,
// NotReady, or with the operation InProgress on their Machine), how many pods are Ready, and how every pod that went
// away went (evicted through the Eviction API from a cordoned node, or not).
//
// The rig's only compromises beyond rig.NewPodsRig's: the watchers' rollout lease and poll are shortened through their
// unit's environment (KUBESLOT_WATCHER_ROLLOUT_LEASE, _POLL; production: 60 s, 10 s), and [timeouts] node_ready is
// 60 s so that a broken kubelet fails within the test (3 m elsewhere on the rig).

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeslot/kubeslot/integration/machineapi"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/integration/workload"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/rollout"
)

// The rig's rollout timings: a lease long enough that a killed holder's repave (which goes on without its watcher)
// is over before its slot expires, a poll short enough that hand-overs do not dominate the figure.
const (
	rrLease    = 45 * time.Second
	rrPoll     = time.Second
	rrReplicas = 3
)

func TestRolloutOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 25*time.Minute)
	defer cancel()
	tAll := time.Now()
	rr := newRolloutRig(t, ctx, "rro", 3)
	rig.Timing(t, "rollout rig: three pods hosts bootstrapped, Machines labelled, pods Ready", time.Since(tAll))

	// 1. One Repave of all three, maxUnavailable 1, drain Evict: one node at a time, the budget holds, every pod
	// is evicted, the operation Succeeded.
	op1 := rr.opName("all")
	s := rr.sample(op1)
	t1 := time.Now()
	rr.create(op1, v1alpha1.Rollout{MaxUnavailable: &intstr.IntOrString{IntVal: 1}})
	op := rr.waitOp(ctx, op1, 10*time.Minute, "Succeeded with 3 done", func(o *v1alpha1.MachineOperation) bool {
		return o.Status.Phase == v1alpha1.OperationSucceeded && o.Status.Done == 3
	})
	took := time.Since(t1)
	s.stop()
	if op.Status.Failed != 0 || op.Status.Waiting != 0 || op.Status.InProgress != 0 || len(op.Status.Machines) != 3 {
		t.Errorf("counts: %s", rig.DescribeOp(op))
	}
	checkRealSteps(t, op)
	s.check(t, "rollout of three", 1, rrReplicas-1)
	if n := s.evictions(t); n < 3 {
		t.Errorf("%d pods evicted in the rollout of three, want one at least per node (3)", n)
	}
	var sum time.Duration
	for _, h := range rr.hosts {
		st := rr.hostStatus(ctx, h, op1)
		if st == nil || st.Phase != requests.Succeeded || st.ActiveSlot != "b" || st.Drain == nil {
			t.Errorf("%s: status of %s %+v, want Succeeded on slot b after a drain", h.Node, op1, st)
			continue
		}
		sum += h.LogStatus(h.Node+": repave in the rollout", st)
	}
	rr.leasesGone(ctx, op1)
	rig.Timing(t, "rollout of 3 hosts, maxUnavailable 1: operation created -> Succeeded", took)
	rig.Timing(t, "rollout of 3 hosts: sum of the 3 repaves (each request's first phase -> final status)", sum)
	rig.Timing(t, "rollout of 3 hosts: hand-over cost (rollout - sum of repaves)", took-sum)
	// In make bench (scripts/benchtable names them too): the rollout's wall time against the same repaves summed.
	rig.Figures.Add("rollout of 3 rig hosts, maxUnavailable 1: operation created -> Succeeded (real repaves, drain)", took)
	rig.Figures.Add("rollout of 3 rig hosts: sum of its 3 repaves (each request's first phase -> final status)", sum)

	// 2. Ordered by label, with a health gate, the second host's repave fails (its Machine names a kubelet that
	// exits at once), failure budget 1: the rollout halts naming it and the third host is never touched; the first
	// host's success passed its gate.
	broken := rr.hosts[1]
	bad := filepath.Join(t.TempDir(), "kubelet-exits")
	if err := os.WriteFile(bad, []byte("#!/bin/sh\necho 'rig: this kubelet exits at once' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	sumBad, err := broken.Srv.Add("kubelet-exits", bad)
	if err != nil {
		t.Fatal(err)
	}
	broken.UpdateMachine(ctx, func(m *v1alpha1.Machine) {
		m.Spec.Node.Artifacts = &v1alpha1.Artifacts{Kubelet: &v1alpha1.Artifact{URL: v1alpha1.URL(broken.Srv.URL("kubelet-exits")),
			SHA256: v1alpha1.SHA256(sumBad)}}
	})
	third := rr.hosts[2]
	thirdSlot, _ := third.Active()
	rr.waitPodsReady(ctx, 3*time.Minute)
	op2 := rr.opName("halt")
	s = rr.sample(op2)
	one := int32(1)
	rr.create(op2, v1alpha1.Rollout{OrderByLabel: "order", FailureBudget: &one, Health: &v1alpha1.RolloutHealth{TimeoutSeconds: 120}})
	op = rr.waitOp(ctx, op2, 8*time.Minute, "Halted", func(o *v1alpha1.MachineOperation) bool {
		return o.Status.Phase == v1alpha1.OperationHalted
	})
	if !strings.Contains(op.Status.Message, broken.Node) || op.Status.Failed != 1 || op.Status.Done != 1 {
		t.Errorf("halted status does not name %s with 1 done and 1 failed: %s", broken.Node, rig.DescribeOp(op))
	}
	// Long enough for a waiting agent to have tried many times over (poll 1 s) and for a slot to expire.
	time.Sleep(rrLease + 5*time.Second)
	op = rr.waitOp(ctx, op2, 10*time.Second, "still Halted with the third Waiting", func(o *v1alpha1.MachineOperation) bool {
		return o.Status.Phase == v1alpha1.OperationHalted && o.Status.Waiting == 1
	})
	s.stop()
	for _, e := range op.Status.Machines {
		if e.Name == third.Node && e.Phase != v1alpha1.OperationWaiting {
			t.Errorf("the third Machine's entry is %s %q, want Waiting", e.Phase, e.Message)
		}
		// The first host's success waited for its health gate: every pod on its real Node Ready, listed by its
		// agent as the node itself.
		if e.Name == rr.hosts[0].Node && (e.Phase != v1alpha1.OperationSucceeded || !strings.Contains(e.Message, "health gate passed")) {
			t.Errorf("the first Machine's entry is %s %q, want Succeeded past its health gate", e.Phase, e.Message)
		}
	}
	if slot, _ := third.Active(); slot != thirdSlot {
		t.Errorf("the third host's slot is %s, was %s before the halted rollout", slot, thirdSlot)
	}
	if st := rr.hostStatus(ctx, third, op2); st != nil {
		t.Errorf("the third host ran a request of the halted rollout: %+v", st)
	}
	if s.everCordoned(third.Node) || s.everDisrupted(third.Node) {
		t.Errorf("the third node was cordoned or disrupted during the halted rollout")
	}
	if st := rr.hostStatus(ctx, broken, op2); st == nil || st.Phase != requests.Failed || !strings.Contains(st.Message, "rolled back") {
		t.Errorf("the broken host's status %+v, want Failed and rolled back", st)
	} else {
		broken.LogStatus(broken.Node+": broken kubelet, rolled back", st)
	}
	s.check(t, "halted rollout", 1, rrReplicas-1)
	s.evictions(t)
	// Cancel (delete) the halted operation and give the second Machine its kubelet back.
	if err := rr.mc.DeleteOperation(ctx, op2); err != nil {
		t.Fatal(err)
	}
	broken.UpdateMachine(ctx, func(m *v1alpha1.Machine) { m.Spec.Node.Artifacts = nil })
	rr.waitPodsReady(ctx, 3*time.Minute)

	// 3. The holder of the slot dies (its watcher killed -9 and kept down): its repave goes on without it, its
	// lease is not renewed and expires, and the rollout goes on to the other two.
	op3 := rr.opName("dead")
	s = rr.sample(op3)
	rr.create(op3, v1alpha1.Rollout{})
	var holder *rig.PodsRig
	rr.waitOp(ctx, op3, 3*time.Minute, "one entry InProgress", func(o *v1alpha1.MachineOperation) bool {
		for _, e := range o.Status.Machines {
			if e.Phase == v1alpha1.OperationInProgress {
				holder = rr.host(e.NodeName)
			}
		}
		return holder != nil
	})
	if out, err := holder.H.Run(ctx, "sh", "-c", "systemctl kill -s KILL kubeslot-watcher.service && systemctl stop kubeslot-watcher.service"); err != nil {
		t.Fatalf("kill the holder's watcher: %v\n%s", err, out)
	}
	killed := time.Now()
	ls := rr.leases(ctx, op3)
	if len(ls) != 1 || ls[0].Spec.HolderIdentity != holder.Node {
		t.Fatalf("leases %v, want one held by %s", rollout.Names(ls), holder.Node)
	}
	lastRenew := ls[0].Spec.RenewTime.Time
	// Its repave runs on: the repaver is its own unit.
	dead := rr.waitHostStatus(ctx, holder, op3, 6*time.Minute)
	if dead.Phase != requests.Succeeded {
		t.Errorf("the dead agent's repave: %+v", dead)
	}
	var next string
	rr.waitOp(ctx, op3, 3*time.Minute, "another Machine InProgress", func(o *v1alpha1.MachineOperation) bool {
		for _, e := range o.Status.Machines {
			if e.Phase == v1alpha1.OperationInProgress && e.NodeName != holder.Node {
				next = e.NodeName
			}
		}
		return next != ""
	})
	ls = rr.leases(ctx, op3)
	if len(ls) != 1 || ls[0].Spec.HolderIdentity != next || ls[0].Spec.LeaseTransitions != 1 {
		t.Errorf("leases %v, want the one slot taken over by %s", rollout.Names(ls), next)
	} else if gap := ls[0].Spec.AcquireTime.Sub(lastRenew); gap < rrLease {
		// One kernel clock for all rig hosts: the gap is comparable.
		t.Errorf("%s took the slot %v after the dead holder's last renewal, before its lease of %v expired", next, gap, rrLease)
	} else {
		// Its entry stays InProgress (nobody publishes for it), but its repave was over before the next began.
		if !dead.UpdatedAt.Before(ls[0].Spec.AcquireTime.Time) {
			t.Errorf("the dead holder's repave finished at %v, after %s took the slot at %v", dead.UpdatedAt, next, ls[0].Spec.AcquireTime.Time)
		}
		rig.Timing(t, fmt.Sprintf("rollout: dead holder's slot taken over after its last renewal (lease %v)", rrLease), gap)
		rig.Timing(t, "rollout: dead holder's watcher killed -> slot taken over", ls[0].Spec.AcquireTime.Sub(killed))
	}
	rr.waitOp(ctx, op3, 8*time.Minute, "the two others done", func(o *v1alpha1.MachineOperation) bool {
		return o.Status.Done == 2 && o.Status.InProgress == 1
	})
	// The holder's watcher back: it publishes the result its repaver left, and the operation is complete.
	if out, err := holder.H.Run(ctx, "sh", "-c", "systemctl reset-failed kubeslot-watcher.service; systemctl start kubeslot-watcher.service"); err != nil {
		t.Fatalf("start the holder's watcher again: %v\n%s", err, out)
	}
	op = rr.waitOp(ctx, op3, 3*time.Minute, "Succeeded with 3 done", func(o *v1alpha1.MachineOperation) bool {
		return o.Status.Phase == v1alpha1.OperationSucceeded && o.Status.Done == 3
	})
	if op.Status.Failed != 0 || len(op.Status.Machines) != 3 {
		t.Errorf("counts: %s", rig.DescribeOp(op))
	}
	s.stop()
	// Two entries InProgress at once: the dead holder's, which nobody updated, and the next one's; the nodes
	// themselves were disrupted one at a time (check: at most one cordoned or NotReady).
	s.check(t, "rollout with a dead holder", 2, rrReplicas-1)
	s.evictions(t)
	rr.leasesGone(ctx, op3)
	rig.Timing(t, "rollout rig test: whole", time.Since(tAll))
}

// rolloutRig is n pods hosts joined to one control plane, their Machines labelled rollout=<prefix> and order=<i>, and
// a Deployment spread over their nodes.
type rolloutRig struct {
	t      *testing.T
	prefix string
	hosts  []*rig.PodsRig
	admin  *kubernetes.Clientset
	mc     *machineapi.Client
	ns     string
	nodes  []string
}

func newRolloutRig(t *testing.T, ctx context.Context, prefix string, n int) *rolloutRig {
	t.Helper()
	rr := &rolloutRig{t: t, prefix: prefix}
	o := rig.Options{NodeReady: "60s", WatcherEnv: []string{
		"KUBESLOT_WATCHER_ROLLOUT_LEASE=" + rrLease.String(), "KUBESLOT_WATCHER_ROLLOUT_POLL=" + rrPoll.String()}}
	for i := range n {
		t0 := time.Now()
		p := rig.NewPodsRig(t, ctx, fmt.Sprintf("%s%d", prefix, i), o)
		rig.Timing(t, fmt.Sprintf("rollout rig: host %d bootstrapped, serving certificate approved", i), time.Since(t0))
		rr.hosts = append(rr.hosts, p)
		rr.nodes = append(rr.nodes, p.Node)
	}
	rr.admin, rr.mc = rr.hosts[0].Admin, rr.hosts[0].MC
	for i, h := range rr.hosts {
		h.EventuallyMachine(ctx, "Machine registered on slot a", func(m *v1alpha1.Machine) bool { return m.Status.ActiveSlot == "a" })
		h.UpdateMachine(ctx, func(m *v1alpha1.Machine) {
			if m.Labels == nil {
				m.Labels = map[string]string{}
			}
			m.Labels["rollout"], m.Labels["order"] = prefix, fmt.Sprint(i)
			m.Spec.Disruption = &v1alpha1.Disruption{Drain: v1alpha1.DrainEvict}
		})
		rig.Enroll(t, ctx, h.CP, h.Node)
	}
	rr.ns = rig.HostName(prefix)
	if _, err := rr.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: rr.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = rr.admin.CoreV1().Namespaces().Delete(cctx, rr.ns, metav1.DeleteOptions{})
	})
	rig.WaitFor(t, ctx, "namespace "+rr.ns+" has its default ServiceAccount", func() bool {
		_, err := rr.admin.CoreV1().ServiceAccounts(rr.ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	})
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); spreadScheduler(sctx, rr.admin, rr.ns, rr.nodes) }()
	t.Cleanup(func() { stop(); <-done })
	rr.deploy(ctx)
	one := intstr.FromInt32(1)
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: rr.ns},
		Spec: policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}}
	if _, err := rr.admin.PolicyV1().PodDisruptionBudgets(rr.ns).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := rr.waitPodsReady(ctx, 5*time.Minute)
	spread := map[string]bool{}
	for _, p := range pods {
		spread[p.Spec.NodeName] = true
	}
	if len(spread) != n {
		t.Errorf("pods on %d nodes, want one on each of %d", len(spread), n)
	}
	return rr
}

// opName is a name for this run's operation: distinct per run (an operation recreated under a name can see the
// old one's RolloutLeases until the garbage collector removes them).
func (rr *rolloutRig) opName(what string) string { return rig.HostName(rr.prefix + "-" + what) }

func (rr *rolloutRig) host(node string) *rig.PodsRig {
	for _, h := range rr.hosts {
		if h.Node == node {
			return h
		}
	}
	rr.t.Fatalf("no rig host has node %s", node)
	return nil
}

// create makes a Repave of the rig's Machines with rollout r, deleted at the end of the test.
func (rr *rolloutRig) create(name string, r v1alpha1.Rollout) {
	rr.t.Helper()
	op := &v1alpha1.MachineOperation{Spec: v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationRepave,
		MachineSelector: &v1alpha1.MachineSelector{MatchLabels: map[string]string{"rollout": rr.prefix}}, Rollout: &r}}
	op.Name = name
	if _, err := rr.mc.CreateOperation(context.Background(), op); err != nil {
		rr.t.Fatal(err)
	}
	rr.t.Cleanup(func() { _ = rr.mc.DeleteOperation(context.Background(), name) })
}

// waitOp polls the operation until ok, bounded by d; on time-out it fails with the status and the watchers' tails.
func (rr *rolloutRig) waitOp(ctx context.Context, name string, d time.Duration, what string, ok func(*v1alpha1.MachineOperation) bool) *v1alpha1.MachineOperation {
	rr.t.Helper()
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var last *v1alpha1.MachineOperation
	for {
		if op, err := rr.mc.GetOperation(wctx, name); err == nil {
			last = op
			if ok(op) {
				return op
			}
		}
		select {
		case <-wctx.Done():
			var tails []string
			for _, h := range rr.hosts {
				j, _ := h.H.Journal(context.Background(), "kubeslot-watcher.service")
				r, _ := h.H.Journal(context.Background(), "kubeslot-repave@next.service")
				tails = append(tails, fmt.Sprintf("%s watcher:\n%s\n%s repaver:\n%s", h.Node, rig.TailLines(j, 25), h.Node, rig.TailLines(r, 25)))
			}
			rr.t.Fatalf("operation %s: %s not reached in %v; last status: %s\n%s", name, what, d, rig.DescribeOp(last), strings.Join(tails, "\n"))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (rr *rolloutRig) leases(ctx context.Context, op string) []v1alpha1.RolloutLease {
	ls, err := rollout.REST{Client: rr.mc.REST()}.List(ctx, op)
	if err != nil {
		rr.t.Fatal(err)
	}
	return ls
}

// leasesGone waits (30 s) until the finished operation's slots were given back.
func (rr *rolloutRig) leasesGone(ctx context.Context, op string) {
	rr.t.Helper()
	rig.Eventually(rr.t, 30*time.Second, "the slots of "+op+" given back", func() (bool, string) {
		ls := rr.leases(ctx, op)
		return len(ls) == 0, fmt.Sprint(rollout.Names(ls))
	})
}

// hostStatus is the host's status file of its repave for operation op (nil when there is none yet).
func (rr *rolloutRig) hostStatus(ctx context.Context, h *rig.PodsRig, op string) *requests.Status {
	// Operation names are unique to the run: the files that name op are few.
	out, _ := h.H.Run(ctx, "sh", "-c", `grep -l -F -e "$1" /opt/kubeslot/status/*.json 2>/dev/null; true`, "sh", `"`+op+`"`)
	for _, f := range strings.Fields(string(out)) {
		data, err := h.H.ReadFile(f)
		if err != nil {
			continue
		}
		var s requests.Status
		if json.Unmarshal(data, &s) == nil && s.Operation == op && s.Kind == requests.Repave {
			return &s
		}
	}
	return nil
}

// waitHostStatus waits until the host's request for op has a final status.
func (rr *rolloutRig) waitHostStatus(ctx context.Context, h *rig.PodsRig, op string, bound time.Duration) *requests.Status {
	rr.t.Helper()
	var st *requests.Status
	rig.Eventually(rr.t, bound, h.Node+": final status of its request for "+op, func() (bool, string) {
		st = rr.hostStatus(ctx, h, op)
		return st != nil && st.Phase.Finished(), fmt.Sprintf("%+v", st)
	})
	return st
}

// deploy creates the Deployment (rrReplicas pods app=web with a readiness probe, the rig's toleration), left to
// the stand-in scheduler.
func (rr *rolloutRig) deploy(ctx context.Context) {
	rr.t.Helper()
	n, no, grace := int32(rrReplicas), false, int64(2)
	labels := map[string]string{"app": "web"}
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: rr.ns},
		Spec: appsv1.DeploymentSpec{Replicas: &n, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
				Tolerations:                  []corev1.Toleration{{Key: "kubeslot.dev/rig", Operator: corev1.TolerationOpExists}},
				AutomountServiceAccountToken: &no, EnableServiceLinks: &no, TerminationGracePeriodSeconds: &grace,
				Containers: []corev1.Container{{Name: "web", Image: rig.PodsImage, ImagePullPolicy: corev1.PullIfNotPresent,
					Ports: []corev1.ContainerPort{{ContainerPort: workload.Port}},
					ReadinessProbe: &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{
						HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(workload.Port)}}}}}}}}}
	if _, err := rr.admin.AppsV1().Deployments(rr.ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		rr.t.Fatal(err)
	}
}

// waitPodsReady waits until rrReplicas pods are Ready, none terminating, and the budget allows one disruption.
func (rr *rolloutRig) waitPodsReady(ctx context.Context, bound time.Duration) []corev1.Pod {
	rr.t.Helper()
	var ready []corev1.Pod
	rig.Eventually(rr.t, bound, fmt.Sprintf("%d pods Ready and the budget allows one disruption", rrReplicas), func() (bool, string) {
		l, err := rr.admin.CoreV1().Pods(rr.ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return false, err.Error()
		}
		ready = nil
		var states []string
		for _, p := range l.Items {
			if podReady(&p) && p.DeletionTimestamp == nil {
				ready = append(ready, p)
			}
			states = append(states, fmt.Sprintf("%s on %q %s ready=%v", p.Name, p.Spec.NodeName, p.Status.Phase, podReady(&p)))
		}
		b, err := rr.admin.PolicyV1().PodDisruptionBudgets(rr.ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		states = append(states, fmt.Sprintf("budget healthy %d allowed %d", b.Status.CurrentHealthy, b.Status.DisruptionsAllowed))
		return len(ready) == rrReplicas && len(l.Items) == rrReplicas && b.Status.ObservedGeneration == b.Generation &&
			b.Status.DisruptionsAllowed == 1, strings.Join(states, "; ")
	})
	return ready
}
