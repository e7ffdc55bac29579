package rollout

// The gates of a paced rollout on the in-process fleet (rollout_fleet_test.go's harness): pause, the emergency stop
// (RolloutStop), maintenance windows, the soak after a canary, and the health gate.

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubeslot/kubeslot/integration/machineapi"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/drain"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/rollout"
)

// TestRolloutPaused: a paused rollout starts nobody and says so in each entry. Unpaused while an admin's
// RolloutStop (the emergency stop) exists, it still starts nobody and takes no slot, each entry naming the stop, and
// no node can create or delete a RolloutStop. With the stop deleted but outside the rollout's maintenance window,
// still nobody starts, each entry saying when the window opens; in a window, it runs to the end.
func TestRolloutPaused(t *testing.T) {
	h := newRolloutFleet(t, "ro4", 3)
	ctx := context.Background()
	h.pacedOperation("ro4-repave", "ro4", v1alpha1.Rollout{Paused: true, MaxUnavailable: &intstr.IntOrString{IntVal: 2}})
	op := h.waitOp("ro4-repave", time.Minute, "3 waiting", func(op *v1alpha1.MachineOperation) bool { return op.Status.Waiting == 3 })
	time.Sleep(5 * roPoll)
	for _, a := range h.agents {
		if n := a.ran.Load(); n != 0 {
			t.Errorf("%s ran %d requests while the rollout is paused", a.name, n)
		}
	}
	op, err := h.admin.GetOperation(ctx, op.Name)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range op.Status.Machines {
		if e.Phase != v1alpha1.OperationWaiting || !strings.Contains(e.Message, "paused") {
			t.Errorf("entry %s: %s %q, want Waiting, paused", e.Name, e.Phase, e.Message)
		}
	}

	stop := &v1alpha1.RolloutStop{Spec: v1alpha1.RolloutStopSpec{Reason: "ro4 incident"}}
	stop.Name = "ro4-stop"
	stops := func(c interface{ REST() rest.Interface }) *rest.Request {
		return c.REST().Post().Resource(v1alpha1.RolloutStopsResource)
	}
	if err := stops(h.admin).Body(stop).Do(ctx).Error(); err != nil {
		t.Fatalf("create the RolloutStop: %v", err)
	}
	deleteStop := func() error {
		return h.admin.REST().Delete().Resource(v1alpha1.RolloutStopsResource).Name(stop.Name).Do(ctx).Error()
	}
	t.Cleanup(func() { _ = deleteStop() })
	op.Spec.Rollout.Paused = false
	if _, err := h.admin.UpdateOperation(ctx, op); err != nil {
		t.Fatalf("unpause: %v", err)
	}
	h.waitOp("ro4-repave", time.Minute, "every entry stopped", func(op *v1alpha1.MachineOperation) bool {
		n := 0
		for _, e := range op.Status.Machines {
			if e.Phase == v1alpha1.OperationWaiting && strings.Contains(e.Message, "RolloutStop ro4-stop exists (ro4 incident)") {
				n++
			}
		}
		return n == 3
	})
	time.Sleep(5 * roPoll)
	for _, a := range h.agents {
		if n := a.ran.Load(); n != 0 {
			t.Errorf("%s ran %d requests while a RolloutStop exists", a.name, n)
		}
	}
	if ls := h.leases("ro4-repave"); len(ls) > 0 {
		t.Errorf("slots taken while a RolloutStop exists: %v", rollout.Names(ls))
	}
	node, err := machineapi.New(h.cfgs[h.agents[0].name].opts.REST)
	if err != nil {
		t.Fatal(err)
	}
	forged := stop.DeepCopy()
	forged.Name = "ro4-node-stop"
	err = stops(node).Body(forged).Do(ctx).Error()
	rig.WantRejected(t, "an enrolled node creates a RolloutStop", err, apierrors.IsForbidden, `cannot create resource "rolloutstops"`)
	err = node.REST().Delete().Resource(v1alpha1.RolloutStopsResource).Name(stop.Name).Do(ctx).Error()
	rig.WantRejected(t, "an enrolled node deletes the RolloutStop", err, apierrors.IsForbidden, `cannot delete resource "rolloutstops"`)

	// Outside the rollout's maintenance window (every day, six hours from now): with the stop gone, still nobody
	// starts, and each entry says when the window opens.
	daily := func(from time.Time, d string) []v1alpha1.MaintenanceWindow {
		return []v1alpha1.MaintenanceWindow{{Start: from.UTC().Format("15:04"), Duration: d, TimeZone: "UTC"}}
	}
	setWindows := func(ws []v1alpha1.MaintenanceWindow) {
		t.Helper()
		cur, err := h.admin.GetOperation(ctx, "ro4-repave")
		if err != nil {
			t.Fatal(err)
		}
		cur.Spec.Rollout.Windows = ws
		if _, err := h.admin.UpdateOperation(ctx, cur); err != nil {
			t.Fatalf("set spec.rollout.windows: %v", err)
		}
	}
	later := time.Now().Add(6 * time.Hour)
	setWindows(daily(later, "1h"))
	if err := deleteStop(); err != nil {
		t.Fatalf("delete the RolloutStop: %v", err)
	}
	opens := later.UTC().Format("2006-01-02 15:04")
	h.waitOp("ro4-repave", time.Minute, "every entry outside the window", func(op *v1alpha1.MachineOperation) bool {
		n := 0
		for _, e := range op.Status.Machines {
			if e.Phase == v1alpha1.OperationWaiting && strings.Contains(e.Message, "outside the maintenance windows") &&
				strings.Contains(e.Message, opens) {
				n++
			}
		}
		return n == 3
	})
	time.Sleep(5 * roPoll)
	for _, a := range h.agents {
		if n := a.ran.Load(); n != 0 {
			t.Errorf("%s ran %d requests outside the maintenance window", a.name, n)
		}
	}
	if ls := h.leases("ro4-repave"); len(ls) > 0 {
		t.Errorf("slots taken outside the maintenance window: %v", rollout.Names(ls))
	}
	// A window open now (from an hour ago, for three hours): the rollout runs.
	setWindows(daily(time.Now().Add(-time.Hour), "3h"))
	h.waitOp("ro4-repave", 2*time.Minute, "Succeeded", func(op *v1alpha1.MachineOperation) bool {
		return op.Status.Phase == v1alpha1.OperationSucceeded && op.Status.Done == 3
	})
	if p := h.peak.Load(); p > 2 {
		t.Errorf("%d requests ran at once, want at most 2", p)
	}
}

// TestRolloutCanaryFirst: canary 1 in label order, then maxUnavailable 2, with a soak of 2 s: the first Machine runs
// alone and succeeds, and the other two start together at least the soak after it finished (its entry's
// completionTime against their startTime).
func TestRolloutCanaryFirst(t *testing.T) {
	h := newRolloutFleet(t, "ro5", 3)
	const soak = 2
	h.pacedOperation("ro5-repave", "ro5", v1alpha1.Rollout{Canary: 1, OrderByLabel: "order",
		MaxUnavailable: &intstr.IntOrString{IntVal: 2}, SoakSeconds: soak})
	op := h.waitOp("ro5-repave", 2*time.Minute, "Succeeded", func(op *v1alpha1.MachineOperation) bool {
		return op.Status.Phase == v1alpha1.OperationSucceeded && op.Status.Done == 3
	})
	canary := op.Status.Target(h.agents[0].name, h.agents[0].name)
	if canary == nil || canary.CompletionTime == nil {
		t.Fatalf("no finished entry of the canary: %s", rig.DescribeOp(op))
	}
	soaked := canary.CompletionTime.Add(soak * time.Second)
	for _, a := range h.agents[1:] {
		e := op.Status.Target(a.name, a.name)
		if e == nil || e.StartTime == nil || e.StartTime.Time.Before(soaked) {
			t.Errorf("%s's entry %+v: started before the canary's soak ended at %v", a.name, e, soaked)
		} else {
			t.Logf("%s started %v after the canary finished (soak %d s)", a.name, e.StartTime.Sub(canary.CompletionTime.Time), soak)
		}
	}
	// The soak after the last Machines holds their slots too, then every slot goes back.
	deadline := time.Now().Add(30 * time.Second)
	for len(h.leases("ro5-repave")) > 0 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	if ls := h.leases("ro5-repave"); len(ls) > 0 {
		t.Errorf("slots not given back after the soak: %v", rollout.Names(ls))
	}
	at := func(a *roAgent) (time.Time, time.Time) {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.started, a.ended
	}
	_, canaryEnd := at(h.agents[0])
	for _, a := range h.agents[1:] {
		if start, _ := at(a); !start.After(canaryEnd) {
			t.Errorf("%s started at %v, before the canary %s finished at %v", a.name, start, h.agents[0].name, canaryEnd)
		}
	}
	// 2 expected (both take a slot within a poll, each runs 1.2 s); 1 only on a starved machine, never more.
	if p := h.peak.Load(); p > 2 {
		t.Errorf("%d requests ran at once after the canary, want at most 2 (maxUnavailable 2)", p)
	} else {
		t.Logf("%d requests ran at once after the canary (maxUnavailable 2)", p)
	}
}

// TestRolloutHealthGate: canary 1, with a health gate whose HTTP check answers 503: the canary's repave succeeds but
// its gate does not pass within 2 s, so its entry fails naming the check's answer and the rollout halts before the
// second Machine starts; the canary's Node, left cordoned by that run, is uncordoned by its agent. With the check
// answering 200, a new rollout passes every gate (its pods: none, in-process).
func TestRolloutHealthGate(t *testing.T) {
	h := newRolloutFleet(t, "ro6", 2)
	var healthy atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if healthy.Load() {
			return
		}
		http.Error(w, "an alert fires", http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	health := &v1alpha1.RolloutHealth{TimeoutSeconds: 2, HTTPChecks: []v1alpha1.HTTPCheck{{URL: v1alpha1.URL(srv.URL + "/alerts?q=up")}}}
	h.pacedOperation("ro6-bad", "ro6", v1alpha1.Rollout{Canary: 1, OrderByLabel: "order", Health: health})
	op := h.waitOp("ro6-bad", 2*time.Minute, "Halted", func(op *v1alpha1.MachineOperation) bool {
		return op.Status.Phase == v1alpha1.OperationHalted
	})
	e := op.Status.Target(h.agents[0].name, h.agents[0].name)
	if e == nil || e.Phase != v1alpha1.OperationFailed || !strings.Contains(e.Message, "health gate not passed within 2s") ||
		!strings.Contains(e.Message, "answered 503") {
		t.Errorf("the canary's entry %+v: want Failed by the health gate, naming the 503", e)
	} else {
		t.Logf("canary: %s", e.Message)
	}
	if n := h.agents[1].ran.Load(); n != 0 {
		t.Errorf("%s ran %d requests after the canary failed its health gate", h.agents[1].name, n)
	}
	uncordonLeftover(t, h, h.agents[0])
	healthy.Store(true)
	h.pacedOperation("ro6-good", "ro6", v1alpha1.Rollout{MaxUnavailable: &intstr.IntOrString{IntVal: 2}, Health: health})
	op = h.waitOp("ro6-good", 2*time.Minute, "Succeeded", func(op *v1alpha1.MachineOperation) bool {
		return op.Status.Phase == v1alpha1.OperationSucceeded && op.Status.Done == 2
	})
	for _, e := range op.Status.Machines {
		if !strings.Contains(e.Message, "health gate passed") {
			t.Errorf("entry %s: %q, want the gate passed", e.Name, e.Message)
		}
	}
}

// uncordonLeftover: a's Node (created here as an admin: in-process agents run no kubelet) is left cordoned by
// kubeslot for a's last request, which has finished: a's watcher uncordons it, as the node itself, and removes the
// annotation.
func uncordonLeftover(t *testing.T, h *roHarness, a *roAgent) {
	t.Helper()
	ctx := context.Background()
	st, _, err := requests.New(a.root).ListStatus()
	if err != nil || len(st) == 0 {
		t.Fatalf("%s: no status on disk (%v)", a.name, err)
	}
	cs, err := kubernetes.NewForConfig(h.cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: a.name, Annotations: map[string]string{drain.Annotation: st[0].RequestID}},
		Spec: corev1.NodeSpec{Unschedulable: true}}
	if _, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Node %s cordoned by %s: %v", a.name, st[0].RequestID, err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Nodes().Delete(context.Background(), a.name, metav1.DeleteOptions{}) })
	deadline := time.Now().Add(time.Minute)
	for {
		got, err := cs.CoreV1().Nodes().Get(ctx, a.name, metav1.GetOptions{})
		if err == nil && !got.Spec.Unschedulable && got.Annotations[drain.Annotation] == "" {
			t.Logf("node %s, left cordoned by the finished %s, uncordoned by its agent", a.name, st[0].RequestID)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s still cordoned a minute after its cordoning request %s finished: %+v, %v", a.name, st[0].RequestID, got, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
