package nodeclient

import (
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestNodeReadySince: a Ready status counts from the kubelet's start
// second on, with a Lease renewed after the start; a status posted in that
// same second is the case that used to be missed (issue 16, item 1).
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
