package repave

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/drain"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/watcher"
)

// TestDrainPodsOnRig: real pods on a rig node, a Deployment of two with a PodDisruptionBudget maxUnavailable 1, and
// the repaver's drain with the node's own identity. The rig has one node and no scheduler; a stand-in binds pending
// pods to the node while it is schedulable, as a scheduler would (so an evicted pod's replacement waits while the
// node is cordoned). 1. Fail: one pod is evicted, the budget then holds the other (named in the status), the repave
// fails in drain and rolls back without stopping the node, the Node is uncordoned and the replacement runs; at no
// sampled moment are both pods down. 2. Force: the repave goes on after the timeout and the pods come back on slot b.
func TestDrainPodsOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	p := rig.NewPodsRig(t, ctx, "dpods", rig.Options{})
	r := p.RepaveRig
	ns := p.Namespace(ctx)
	sctx, stopScheduler := context.WithCancel(ctx)
	defer stopScheduler()
	go standInScheduler(sctx, p.Admin, ns, p.Node)
	p.DeployUnbound(ctx, ns)
	one := intstr.FromInt32(1)
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}}
	if _, err := p.Admin.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := p.WaitPods(ctx, ns, time.Time{}, 4*time.Minute)
	rig.WaitFor(t, ctx, "the budget allows one disruption", func() bool {
		b, err := p.Admin.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "web", metav1.GetOptions{})
		return err == nil && b.Status.ObservedGeneration == b.Generation && b.Status.CurrentHealthy == 2 && b.Status.DisruptionsAllowed == 1
	})
	minReady, stopSampling := sampleReady(ctx, p.Admin, ns)

	// 1. Fail.
	_, applied := r.Active()
	req := &requests.Request{Kind: requests.Repave, ID: requests.NewID(requests.Repave, 2, ""), MachineGeneration: 2,
		Reason: "rig: drain with a budget", Desired: applied.Config,
		Disruption: &drain.Policy{Timeout: 20 * time.Second, OnTimeout: drain.Fail}}
	t1 := time.Now()
	r.Drop(ctx, req)
	s := r.WaitStatus(ctx, req.ID, 6*time.Minute)
	r.LogStatus("drain with a budget, Fail", s)
	rig.Timing(t, "drain with real pods: request -> Failed in drain, rolled back (20 s drain timeout)", time.Since(t1))
	if s.Phase != requests.Failed || s.ActiveSlot != "a" || !strings.Contains(s.Message, "failed in drain") ||
		!strings.Contains(s.Message, "PodDisruptionBudget "+ns+"/web") || s.Downtime != 0 {
		t.Errorf("status %+v, want Failed in drain naming the budget, rolled back with no downtime", s)
	}
	if s.Drain == nil || s.Drain.Outcome != drain.Failed || s.Drain.BlockingPDB != ns+"/web" {
		t.Errorf("drain progress %+v", s.Drain)
	}
	if u, by := rig.NodeState(t, ctx, p.Admin, p.Node); u || by != "" {
		t.Errorf("after the rollback: Node unschedulable %v, annotation %q", u, by)
	}
	after := p.WaitPods(ctx, ns, time.Time{}, 4*time.Minute)
	kept := 0
	for _, a := range after {
		for _, b := range before {
			if a.UID == b.UID {
				kept++
			}
		}
	}
	if kept != 1 {
		t.Errorf("%d of the two pods are the ones from before the drain, want 1 (one evicted, one held by the budget)", kept)
	}
	// The watcher publishes the drain on the Machine: the Draining condition and an Event.
	r.EventuallyMachine(ctx, "Draining=False/DrainFailed naming the budget", func(m *v1alpha1.Machine) bool {
		c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.ConditionDraining)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonDrainFailed && strings.Contains(c.Message, ns+"/web")
	})
	evs, err := p.Admin.CoreV1().Events(watcher.EventNamespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + r.Node})
	var reasons []string
	for _, e := range evs.Items {
		reasons = append(reasons, e.Reason)
	}
	if err != nil || !slices.Contains(reasons, v1alpha1.ReasonDrainFailed) {
		t.Errorf("Events of Machine %s: %v (%v), want one %s", r.Node, reasons, err, v1alpha1.ReasonDrainFailed)
	}
	if m := minReady(); m != 1 {
		t.Errorf("fewest Ready pods sampled during the drain and the rollback: %d, want 1 (one evicted, never both)", m)
	}
	stopSampling()

	// 2. Force.
	req2 := &requests.Request{Kind: requests.Repave, ID: requests.NewID(requests.Repave, 3, ""), MachineGeneration: 3,
		Reason: "rig: drain forced", Desired: applied.Config,
		Disruption: &drain.Policy{Timeout: 10 * time.Second, OnTimeout: drain.Force}}
	t2 := time.Now()
	r.Drop(ctx, req2)
	s = r.WaitStatus(ctx, req2.ID, 6*time.Minute)
	r.LogStatus("drain with a budget, Force", s)
	if s.Phase != requests.Succeeded || s.ActiveSlot != "b" || !strings.Contains(s.Message, "forced") || s.Drain == nil || s.Drain.Outcome != drain.Forced {
		t.Errorf("status %+v, want Succeeded on b with the drain forced", s)
	}
	p.WaitPods(ctx, ns, t2, 4*time.Minute)
	rig.Timing(t, "drain with real pods: request -> forced repave -> pods Ready on slot b", time.Since(t2))
	r.EventuallyMachine(ctx, "Draining=False/DrainForced", func(m *v1alpha1.Machine) bool {
		c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.ConditionDraining)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonDrainForced
	})
	if u, by := rig.NodeState(t, ctx, p.Admin, p.Node); u || by != "" {
		t.Errorf("after the forced repave: Node unschedulable %v, annotation %q", u, by)
	}
}

// standInScheduler binds the pods of ns that no node has to node while the Node is schedulable, every 200 ms, until
// ctx ends: what a scheduler does on a one-node cluster, cordon respected.
func standInScheduler(ctx context.Context, cs *kubernetes.Clientset, ns, node string) {
	for ctx.Err() == nil {
		if n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err == nil && !n.Spec.Unschedulable {
			if l, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName="}); err == nil {
				for _, p := range l.Items {
					if p.DeletionTimestamp == nil {
						_ = cs.CoreV1().Pods(ns).Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: ns},
							Target: corev1.ObjectReference{Kind: "Node", Name: node}}, metav1.CreateOptions{})
					}
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// sampleReady counts the Ready, not terminating pods app=web in ns every 100 ms; min returns the fewest seen so far
// (-1 before any sample), stop ends the sampling.
func sampleReady(ctx context.Context, cs *kubernetes.Clientset, ns string) (min func() int, stop func()) {
	var mu sync.Mutex
	fewest := -1
	sctx, cancel := context.WithCancel(ctx)
	go func() {
		for sctx.Err() == nil {
			if l, err := cs.CoreV1().Pods(ns).List(sctx, metav1.ListOptions{LabelSelector: "app=web"}); err == nil {
				n := 0
				for _, p := range l.Items {
					for _, c := range p.Status.Conditions {
						if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil {
							n++
						}
					}
				}
				mu.Lock()
				if fewest < 0 || n < fewest {
					fewest = n
				}
				mu.Unlock()
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	return func() int { mu.Lock(); defer mu.Unlock(); return fewest }, cancel
}
