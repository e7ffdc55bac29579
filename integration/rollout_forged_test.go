package integration

// A node can write entries under its own node name into any operation's status.machines: admission checks status
// writes from the request alone (DESIGN.md, "Admission cost"). What keeps such an entry from steering a rollout is
// that every reader counts only entries whose Machine exists with that node name and that the operation targets.

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// TestRolloutForgedEntries: a node no operation targets writes, while the rollout is paused, a Failed entry for a
// Machine that does not exist, a Failed entry for a real target under its own node name, and a Waiting entry that
// would sort first in the order; it also writes a summary that says Halted. Unpaused, the rollout (failure budget 1,
// ordered, one at a time) runs every target to Succeeded anyway, and the summary the agents write says how many
// entries they left out.
func TestRolloutForgedEntries(t *testing.T) {
	h := newRolloutFleet(t, "ro7", 3)
	one := int32(1)
	h.pacedOperation("ro7-repave", "ro7", v1alpha1.Rollout{FailureBudget: &one, OrderByLabel: "order",
		MaxUnavailable: &intstr.IntOrString{IntVal: 1}, Paused: true})
	h.waitOp("ro7-repave", time.Minute, "three targets Waiting (paused)", func(op *v1alpha1.MachineOperation) bool {
		return op.Status.Waiting == 3
	})

	const outsider = "ro7-outsider"
	forger := nodeAPI(t, h.cp, outsider)
	forged := []v1alpha1.MachineOperationTarget{
		{Name: "no-such-machine", NodeName: outsider, Phase: v1alpha1.OperationFailed, Message: "forged"},
		{Name: "ro7-2", NodeName: outsider, Phase: v1alpha1.OperationFailed, Message: "forged"},
		{Name: "ro7-0", NodeName: outsider, Phase: v1alpha1.OperationWaiting, OrderKey: "", Message: "forged"},
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got, err := forger.UpdateOperationStatus(ctx, "ro7-repave", func(op *v1alpha1.MachineOperation) error {
		for _, e := range forged {
			v1alpha1.SetMachineResult(op, e, v1alpha1.CountAll) // the forger counts its own entries
		}
		return nil
	})
	if err != nil {
		t.Fatalf("node %s writes entries of its own node name: %v (admission checks only the node name)", outsider, err)
	}
	if got.Status.Phase != v1alpha1.OperationHalted || got.Status.Failed != 2 {
		t.Fatalf("the forger's summary: %s, want its own Halted with 2 failed (what a reader must not believe)", describeOp(got))
	}

	op, err := h.admin.GetOperation(ctx, "ro7-repave")
	if err != nil {
		t.Fatal(err)
	}
	op.Spec.Rollout.Paused = false
	if _, err := h.admin.UpdateOperation(ctx, op); err != nil {
		t.Fatalf("unpause: %v", err)
	}
	op = h.waitOp("ro7-repave", 3*time.Minute, "Succeeded with 3 done", func(op *v1alpha1.MachineOperation) bool {
		return op.Status.Phase == v1alpha1.OperationSucceeded && op.Status.Done == 3
	})
	if op.Status.Failed != 0 || op.Status.Waiting != 0 || !strings.Contains(op.Status.Message, "3 entries not counted") {
		t.Errorf("final summary: %s, want 0 failed, 0 waiting and the 3 forged entries said not counted", describeOp(op))
	}
	if len(op.Status.Machines) != 6 {
		t.Errorf("%d entries, want the 3 targets' and the 3 forged ones kept (no agent may remove another node's): %s",
			len(op.Status.Machines), describeOp(op))
	}
	for _, a := range h.agents {
		if n := a.ran.Load(); n != 1 {
			t.Errorf("%s ran %d requests, want 1", a.name, n)
		}
	}
	if p := h.peak.Load(); p != 1 {
		t.Errorf("%d requests ran at once, want 1 (maxUnavailable 1)", p)
	}
}
