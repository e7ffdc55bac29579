package cluster

// The drain (lib/drain) against the real kube-apiserver and controller manager, acting as node
// identities (the kubelet client certificate an agent uses): what is evicted and what is left, a
// PodDisruptionBudget that blocks until the timeout under Fail and Force, the budget named, a person's cordon
// kept, and that node A can neither evict node B's pods nor cordon B's Node.

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeslot/kubeslot/integration/kube"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/drain"
	"github.com/kubeslot/kubeslot/lib/drain/drainkube"
)

// drainRig is two Nodes, drain-a and drain-b, each registered by its own identity, and a namespace for pods.
type drainRig struct {
	ns      string
	admin   *kubernetes.Clientset
	a, b    *kubernetes.Clientset
	nodeUID map[string]types.UID
}

func newDrainRig(t *testing.T, ctx context.Context, cp *kube.ControlPlane, ns string) *drainRig {
	t.Helper()
	r := &drainRig{ns: ns, admin: clientFor(t, cp.AdminConfig()), nodeUID: map[string]types.UID{}}
	ident := func(node string) *kubernetes.Clientset {
		cert, key, err := cp.NodeClientCert(node)
		if err != nil {
			t.Fatal(err)
		}
		return clientFor(t, cp.CertConfig(cert, key))
	}
	r.a, r.b = ident("drain-a"), ident("drain-b")
	for node, c := range map[string]*kubernetes.Clientset{"drain-a": r.a, "drain-b": r.b} {
		n, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node,
			Labels: map[string]string{"drain-test": node}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("register Node %s as itself: %v", node, err)
		}
		r.nodeUID[node] = n.UID
		t.Cleanup(func() { _ = r.admin.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	}
	if _, err := r.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The rig's controller manager has no namespace controller: what the test made is deleted here.
	t.Cleanup(func() {
		bg, zero := context.Background(), int64(0)
		_ = r.admin.AppsV1().DaemonSets(r.ns).DeleteCollection(bg, metav1.DeleteOptions{}, metav1.ListOptions{})
		_ = r.admin.AppsV1().ReplicaSets(r.ns).DeleteCollection(bg, metav1.DeleteOptions{}, metav1.ListOptions{})
		_ = r.admin.PolicyV1().PodDisruptionBudgets(r.ns).DeleteCollection(bg, metav1.DeleteOptions{}, metav1.ListOptions{})
		_ = r.admin.CoreV1().Pods(r.ns).DeleteCollection(bg, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		_ = r.admin.CoreV1().Namespaces().Delete(bg, r.ns, metav1.DeleteOptions{})
	})
	// No kubelet runs: a terminating pod is finished off as its kubelet would, once its containers stopped.
	kctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	go func() {
		for kctx.Err() == nil {
			if l, err := r.admin.CoreV1().Pods(r.ns).List(kctx, metav1.ListOptions{}); err == nil {
				for _, p := range l.Items {
					if p.DeletionTimestamp != nil {
						_ = r.admin.CoreV1().Pods(r.ns).Delete(kctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
					}
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	return r
}

func (r *drainRig) podOn(name, node string, labels map[string]string, emptyDir bool) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: r.ns, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/app:1"}}}}
	if emptyDir {
		p.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	}
	return p
}

func (r *drainRig) createPod(t *testing.T, ctx context.Context, p *corev1.Pod) {
	t.Helper()
	if _, err := r.admin.CoreV1().Pods(r.ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", p.Name, err)
	}
}

// podsOn names the pods bound to node, sorted.
func (r *drainRig) podsOn(t *testing.T, ctx context.Context, node string) []string {
	t.Helper()
	l, err := r.admin.CoreV1().Pods(r.ns).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range l.Items {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out
}

// setUpWorkload puts on drain-a: two plain pods (one with an emptyDir), a ReplicaSet's pod guarded by a budget
// with maxUnavailable 0, a DaemonSet's pod and a mirror pod (created by the node, as its kubelet would); on
// drain-b one plain pod.
func (r *drainRig) setUpWorkload(t *testing.T, ctx context.Context) {
	t.Helper()
	r.createPod(t, ctx, r.podOn("web", "drain-a", nil, false))
	r.createPod(t, ctx, r.podOn("scratch", "drain-a", nil, true))
	r.createPod(t, ctx, r.podOn("b-web", "drain-b", nil, false))
	one := int32(1)
	guarded := map[string]string{"app": "guarded"}
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "guarded", Namespace: r.ns},
		Spec: appsv1.ReplicaSetSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: guarded},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: guarded}, Spec: r.podOn("", "drain-a", nil, false).Spec}}}
	if _, err := r.admin.AppsV1().ReplicaSets(r.ns).Create(ctx, rs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	zero := intstr.FromInt32(0)
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "guard", Namespace: r.ns},
		Spec: policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &zero, Selector: &metav1.LabelSelector{MatchLabels: guarded}}}
	if _, err := r.admin.PolicyV1().PodDisruptionBudgets(r.ns).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "agent", Namespace: r.ns},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "ds"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "ds"}},
				// Tolerating all, as a CNI's DaemonSet does: a Node with no kubelet is tainted not-ready.
				Spec: corev1.PodSpec{NodeSelector: map[string]string{"drain-test": "drain-a"}, Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/ds:1"}}}}}}
	if _, err := r.admin.AppsV1().DaemonSets(r.ns).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	yes := true
	mirror := r.podOn("static-drain-a", "drain-a", nil, false)
	mirror.Annotations = map[string]string{"kubernetes.io/config.mirror": "hash", "kubernetes.io/config.source": "file"}
	mirror.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: "drain-a", UID: r.nodeUID["drain-a"], Controller: &yes}}
	if _, err := r.a.CoreV1().Pods(r.ns).Create(ctx, mirror, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the node's mirror pod: %v", err)
	}
	// There is no scheduler: the DaemonSet's pod is bound here, as the scheduler would.
	rig.WaitFor(t, ctx, "the DaemonSet's pod bound to drain-a", func() bool {
		l, err := r.admin.CoreV1().Pods(r.ns).List(ctx, metav1.ListOptions{LabelSelector: "app=ds"})
		if err != nil || len(l.Items) == 0 {
			return false
		}
		p := l.Items[0]
		if p.Spec.NodeName != "" {
			return true
		}
		_ = r.admin.CoreV1().Pods(r.ns).Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: r.ns},
			Target: corev1.ObjectReference{Kind: "Node", Name: "drain-a"}}, metav1.CreateOptions{})
		return false
	})
	rig.WaitFor(t, ctx, "the ReplicaSet's pod on drain-a", func() bool { return len(r.podsOn(t, ctx, "drain-a")) == 5 })
	// The eviction API lets a Pending pod go whatever its budget says, and no kubelet runs here: the guarded pod is
	// reported Running and Ready, as its kubelet would, so that the budget counts it healthy and holds it.
	l, err := r.admin.CoreV1().Pods(r.ns).List(ctx, metav1.ListOptions{LabelSelector: "app=guarded"})
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("the guarded pod: %v, %v", l, err)
	}
	g := &l.Items[0]
	now := metav1.Now()
	g.Status.Phase = corev1.PodRunning
	g.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}
	if _, err := r.admin.CoreV1().Pods(r.ns).UpdateStatus(ctx, g, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	rig.WaitFor(t, ctx, "the budget processed", func() bool {
		p, err := r.admin.PolicyV1().PodDisruptionBudgets(r.ns).Get(ctx, "guard", metav1.GetOptions{})
		return err == nil && p.Status.ObservedGeneration == p.Generation && p.Status.ExpectedPods == 1 &&
			p.Status.CurrentHealthy == 1 && p.Status.DisruptionsAllowed == 0
	})
}

func drainerAs(c *kubernetes.Clientset, node string, t *testing.T, progress *[]drain.Progress) *drain.Drainer {
	return &drain.Drainer{Cluster: drainkube.Kube{Client: c}, Node: node, Poll: 200 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(t.Output(), nil)), Progress: func(p drain.Progress) { *progress = append(*progress, p) }}
}

// TestDrainOnAPI: node drain-a drains itself with its own identity: the preflight under Refuse refuses before the
// cordon, naming the budget that never allows a disruption; Fail times out on the budget, naming it, with
// the plain pods evicted and the DaemonSet and mirror pods left; the uncordon takes back the cordon; Force goes on
// with the guarded pod left; an emptyDir pod is refused at once without deleteEmptyDirData; a person's cordon of
// drain-b survives drain-b's drain and uncordon.
func TestDrainOnAPI(t *testing.T) {
	cp := rig.NeedCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	r := newDrainRig(t, ctx, cp, "drain-test")
	r.setUpWorkload(t, ctx)

	var prog []drain.Progress
	a := drainerAs(r.a, "drain-a", t, &prog)
	// The preflight, as the node (kubeslot:agent lets every node list budgets): under Refuse the guard budget, which
	// never lets its pod go, refuses the drain before the cordon, naming it and its pod; nothing is evicted.
	rig.NeedAPI(t)
	_, err := a.Drain(ctx, drain.Policy{Timeout: 6 * time.Second, PDBPreflight: drain.Refuse}, "repave-0-spec")
	if pe, ok := errors.AsType[*drain.PreflightError](err); !ok || !strings.Contains(err.Error(), "drain-test/guard never allows a disruption") ||
		!strings.Contains(err.Error(), "drain-test/guarded-") || pe.Unknown != "" {
		t.Fatalf("preflight Refuse: %v, want a refusal naming the budget and its pod", err)
	}
	if u, by := rig.NodeState(t, ctx, r.admin, "drain-a"); u || by != "" {
		t.Errorf("drain-a after a refused preflight: unschedulable %v, annotation %q", u, by)
	}
	if n := len(r.podsOn(t, ctx, "drain-a")); n != 5 {
		t.Errorf("%d pods on drain-a after a refused preflight, want all 5", n)
	}
	prog = nil
	t0 := time.Now()
	_, err = a.Drain(ctx, drain.Policy{Timeout: 6 * time.Second, OnTimeout: drain.Fail, DeleteEmptyDirData: true}, "repave-1-spec")
	var te *drain.TimeoutError
	if !errors.As(err, &te) || te.PDB != r.ns+"/guard" || !strings.Contains(err.Error(), "PodDisruptionBudget drain-test/guard") {
		t.Fatalf("Fail: %v, want a timeout naming the budget", err)
	}
	t.Logf("Fail after %s: %v", time.Since(t0).Round(time.Millisecond), err)
	left := r.podsOn(t, ctx, "drain-a")
	if len(left) != 3 || !slices.Contains(left, "static-drain-a") || slices.Contains(left, "web") || slices.Contains(left, "scratch") {
		t.Errorf("pods left on drain-a: %v, want the guarded, the DaemonSet's and the mirror pod", left)
	}
	if !slices.ContainsFunc(prog, func(p drain.Progress) bool { return !p.Done && p.BlockingPDB == r.ns+"/guard" && p.PodsLeft == 1 }) {
		t.Errorf("no progress named the budget with 1 pod left: %+v", prog)
	}
	if u, by := rig.NodeState(t, ctx, r.admin, "drain-a"); !u || by != "repave-1-spec" {
		t.Errorf("drain-a after the drain: unschedulable %v, annotation %q", u, by)
	}
	if err := a.Uncordon(ctx); err != nil {
		t.Fatal(err)
	}
	if u, by := rig.NodeState(t, ctx, r.admin, "drain-a"); u || by != "" {
		t.Errorf("drain-a after the uncordon: unschedulable %v, annotation %q", u, by)
	}

	res, err := a.Drain(ctx, drain.Policy{Timeout: 3 * time.Second, OnTimeout: drain.Force}, "restart-2-op")
	if err != nil || !res.Forced || !slices.ContainsFunc(res.Left, func(p string) bool { return strings.HasPrefix(p, r.ns+"/guarded-") }) ||
		!strings.Contains(res.Message, "drain-test/guard") {
		t.Errorf("Force: %+v, %v", res, err)
	}
	if err := a.Uncordon(ctx); err != nil {
		t.Fatal(err)
	}

	r.createPod(t, ctx, r.podOn("scratch2", "drain-a", nil, true))
	r.createPod(t, ctx, r.podOn("web2", "drain-a", nil, false))
	_, err = a.Drain(ctx, drain.Policy{Timeout: time.Minute}, "repave-3-spec")
	if err == nil || !strings.Contains(err.Error(), "drain-test/scratch2") || !strings.Contains(err.Error(), "deleteEmptyDirData") {
		t.Errorf("emptyDir under Fail: %v", err)
	}
	if pods := r.podsOn(t, ctx, "drain-a"); !slices.Contains(pods, "web2") {
		t.Errorf("a drain refused for an emptyDir pod evicted others: %v", pods)
	}
	_ = a.Uncordon(ctx)

	// A person cordons drain-b; its own drain leaves that cordon in place.
	if _, err := r.admin.CoreV1().Nodes().Patch(ctx, "drain-b", types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	b := drainerAs(r.b, "drain-b", t, &prog)
	t1 := time.Now()
	if _, err := b.Drain(ctx, drain.Policy{Timeout: 30 * time.Second}, "repave-1-spec"); err != nil {
		t.Fatal(err)
	}
	// Evicted, terminated by the stand-in kubelet (100 ms polls) and seen gone by the drain (200 ms polls).
	rig.Timing(t, "drain: one pod evicted and gone, as the node", time.Since(t1))
	rig.Figures.Add("drain: one pod evicted and gone (API only, no kubelet)", time.Since(t1))
	if err := b.Uncordon(ctx); err != nil {
		t.Fatal(err)
	}
	if u, by := rig.NodeState(t, ctx, r.admin, "drain-b"); !u || by != "" {
		t.Errorf("drain-b after a person's cordon and kubeslot's drain: unschedulable %v, annotation %q", u, by)
	}
	if pods := r.podsOn(t, ctx, "drain-b"); len(pods) != 0 {
		t.Errorf("pods left on drain-b: %v", pods)
	}
}

// crossNode is what identity c gets when it tries, as a dry run, to evict pod on drain-b, to cordon Node drain-b
// and to list drain-b's pods.
func crossNode(ctx context.Context, c *kubernetes.Clientset, ns, pod string) (evict, cordon, list error) {
	dry := []string{metav1.DryRunAll}
	evict = c.CoreV1().Pods(ns).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: ns},
		DeleteOptions: &metav1.DeleteOptions{DryRun: dry}})
	_, cordon = c.CoreV1().Nodes().Patch(ctx, "drain-b", types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`),
		metav1.PatchOptions{DryRun: dry})
	_, list = c.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=drain-b"})
	return evict, cordon, list
}

// TestDrainAccess: node drain-a may not evict drain-b's pod, cordon drain-b's Node or list its pods, while drain-b
// may do all three for itself. The same check passes for an identity RBAC lets do it (agent-0 with a role that
// allows evictions and Node patches) — it reports "allowed", so the check would catch a looser policy — and an
// RBAC grant of the same to every node does not open it for drain-a: NodeRestriction, not RBAC, confines it.
func TestDrainAccess(t *testing.T) {
	cp := rig.NeedCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	r := newDrainRig(t, ctx, cp, "drain-access")
	r.createPod(t, ctx, r.podOn("b-web", "drain-b", nil, false))
	// The eviction's admission (NodeRestriction) reads the pod from the apiserver's informer cache, which learns
	// of a new pod a moment after its create returned: until then every eviction of it is NotFound, for drain-a as
	// for drain-b. drain-b's own dry-run eviction going through says the cache has it.
	rig.WaitFor(t, ctx, "the apiserver's admission sees pod b-web (drain-b's own dry-run eviction allowed)", func() bool {
		ev, _, _ := crossNode(ctx, r.b, r.ns, "b-web")
		return ev == nil
	})

	refused := func(who string, c *kubernetes.Clientset) {
		t.Helper()
		ev, co, li := crossNode(ctx, c, r.ns, "b-web")
		for what, err := range map[string]error{"evict drain-b's pod": ev, "cordon drain-b": co, "list drain-b's pods": li} {
			if !apierrors.IsForbidden(err) {
				t.Errorf("%s: %s: %v, want Forbidden", who, what, err)
			} else {
				t.Logf("%s: %s: refused: %v", who, what, err)
			}
		}
	}
	refused("drain-a", r.a)
	if ev, co, li := crossNode(ctx, r.b, r.ns, "b-web"); ev != nil || co != nil || li != nil {
		t.Errorf("drain-b for itself: evict %v, cordon %v, list %v; want all allowed", ev, co, li)
	}

	// A role that allows what the drain does, bound to agent-0 (not a node: no NodeRestriction) and to every node.
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "drain-test-loose"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods/eviction"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"patch"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}}}}
	if _, err := r.admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.admin.RbacV1().ClusterRoles().Delete(context.Background(), role.Name, metav1.DeleteOptions{})
	})
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "drain-test-loose"},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "agent-0"},
			{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:nodes"}}}
	if _, err := r.admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})
	tok, err := cp.TokenFor("agent-0", kube.AgentGroup)
	if err != nil {
		t.Fatal(err)
	}
	loose := clientFor(t, cp.TokenConfig(tok))
	rig.WaitFor(t, ctx, "the loose role in force for agent-0", func() bool {
		ev, co, li := crossNode(ctx, loose, r.ns, "b-web")
		return ev == nil && co == nil && li == nil
	})
	// With RBAC allowing it, the list is the authorizer's (allowed); the eviction and the cordon stay refused.
	ev, co, _ := crossNode(ctx, r.a, r.ns, "b-web")
	if !apierrors.IsForbidden(ev) || !strings.Contains(ev.Error(), "can only evict pods with spec.nodeName set to itself") {
		t.Errorf("drain-a with RBAC allowing it: evict drain-b's pod: %v, want NodeRestriction's refusal", ev)
	}
	if !apierrors.IsForbidden(co) || !strings.Contains(co.Error(), `is not allowed to modify node "drain-b"`) {
		t.Errorf("drain-a with RBAC allowing it: cordon drain-b: %v, want NodeRestriction's refusal", co)
	}
}
