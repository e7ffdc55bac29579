package nodeclient

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubeslot/kubeslot/lib/config"
)

// TestNodeReadySince: a Ready status counts from the kubelet's start
// second on, with a Lease renewed after the start; a status posted in that
// same second is the case easiest to miss.
func TestNodeReadySince(t *testing.T) {
	since := time.Date(2026, 12, 3, 7, 0, 5, 300_000_000, time.UTC) // the new kubelet started
	node := func(status corev1.ConditionStatus, hb time.Time) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, LastHeartbeatTime: metav1.NewTime(hb)},
			{Type: corev1.NodeReady, Status: status, LastHeartbeatTime: metav1.NewTime(hb), Message: "kubelet says so"},
		}}}
	}
	lease := func(renew time.Time) *coordinationv1.Lease {
		return &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: renew}}}
	}
	sameSecond := since.Truncate(time.Second) // what the API keeps of a status posted at 07:00:05.9
	cases := []struct {
		name  string
		n     *corev1.Node
		l     *coordinationv1.Lease
		since time.Time
		ok    bool
		why   string
	}{
		{"status in the start second, lease renewed after", node(corev1.ConditionTrue, sameSecond), lease(since.Add(40 * time.Millisecond)), since, true, ""},
		{"status a second later", node(corev1.ConditionTrue, sameSecond.Add(time.Second)), lease(since.Add(time.Second)), since, true, ""},
		{"status from an earlier second", node(corev1.ConditionTrue, sameSecond.Add(-time.Second)), lease(since.Add(time.Second)), since, false, "before the kubelet started"},
		{"lease last renewed by the old kubelet", node(corev1.ConditionTrue, sameSecond), lease(since.Add(-200 * time.Millisecond)), since, false, "Lease was last renewed"},
		{"no lease yet", node(corev1.ConditionTrue, sameSecond), nil, since, false, "not renewed yet"},
		{"not ready", node(corev1.ConditionFalse, sameSecond.Add(time.Second)), lease(since.Add(time.Second)), since, false, "Ready=False: kubelet says so"},
		{"no floor: any Ready", node(corev1.ConditionTrue, sameSecond.Add(-time.Hour)), nil, time.Time{}, true, ""},
		{"no Ready condition", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, nil, time.Time{}, false, "no Ready condition"},
	}
	for _, c := range cases {
		ok, why := NodeReadySince(c.n, c.l, c.since)
		if ok != c.ok || !strings.Contains(why, c.why) {
			t.Errorf("%s: %v %q, want %v %q", c.name, ok, why, c.ok, c.why)
		}
	}
}

// TestWaitReadyFollowsTheNode: the wait reads the Node once and then sees
// the new kubelet's Ready status through its watch, not by reading again;
// the Lease, which a node may not watch, is read again until it counts.
func TestWaitReadyFollowsTheNode(t *testing.T) {
	since := time.Now().Add(-time.Minute)
	old := metav1.NewTime(since.Add(-time.Hour))
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-1"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: old}}}}
	renew := metav1.NewMicroTime(since.Add(-time.Hour))
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "worker-1", Namespace: corev1.NamespaceNodeLease},
		Spec: coordinationv1.LeaseSpec{RenewTime: &renew}}
	cs := fake.NewClientset(node, lease)
	var nodeGets, leaseGets atomic.Int32
	cs.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		nodeGets.Add(1)
		return false, nil, nil
	})
	cs.PrependReactor("get", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		leaseGets.Add(1)
		return false, nil, nil
	})
	var watches atomic.Int32
	cs.PrependWatchReactor("nodes", func(k8stesting.Action) (bool, watch.Interface, error) {
		watches.Add(1)
		return false, nil, nil
	})
	cfg := &config.Config{Machine: config.Machine{NodeName: "worker-1"}}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- waitReady(ctx, cs, cfg, since, time.Now()) }()

	// The new kubelet posts Ready, then renews its Lease a little later.
	waitFor(t, func() bool { return watches.Load() == 1 })
	time.Sleep(10 * time.Millisecond) // the fake registers the watch after its reactors
	n := node.DeepCopy()
	n.Status.Conditions[0].LastHeartbeatTime = metav1.Now()
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return leaseGets.Load() >= 2 })
	select {
	case err := <-done:
		t.Fatalf("ready before the Lease was renewed: %v", err)
	default:
	}
	l := lease.DeepCopy()
	now := metav1.NowMicro()
	l.Spec.RenewTime = &now
	if _, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := nodeGets.Load(); got != 1 {
		t.Errorf("the Node was read %d times, want once (then watched)", got)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
	}
}
