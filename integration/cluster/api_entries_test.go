package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/integration/machineapi"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// agentForgedEntries (TestAPIAgentAccess): node api-a writes, under its own node name, entries the readers must not
// count. Operations api-op-b (machineRef api-b) and api-op-sel-b (selector pool=api-b) exist; report builds the
// mutation that writes one entry.
func agentForgedEntries(t *testing.T, ctx context.Context, admin, a, b *machineapi.Client,
	report func(name, node, phase string) func(*v1alpha1.MachineOperation) error) {
	// Entries under its own node name that name another node's Machine, or a Machine the operation does not
	// target, or none at all: admitted since status writes are checked from the request alone (no pass over every
	// Machine: DESIGN.md, "Admission cost"). The guarantee moved to the readers, checked here as the watcher reads:
	// an entry counts only when its Machine exists with that nodeName and the operation targets it.
	forged := []struct{ op, machine string }{
		{"api-op-b", "api-b"},               // api-b's Machine, the operation's target, under node api-a
		{"api-op-sel-b", "api-a"},           // api-a's own Machine, which the selector does not match
		{"api-op-sel-b", "no-such-machine"}, // no Machine at all
	}
	for _, f := range forged {
		if _, err := a.UpdateOperationStatus(ctx, f.op, report(f.machine, "api-a", "Failed")); err != nil {
			t.Errorf("api-a writes an entry of its node for %s on %s: %v, want it admitted (readers check it)", f.machine, f.op, err)
		}
	}
	machines := []v1alpha1.Machine{}
	for _, name := range []string{"api-a", "api-b"} {
		m, err := admin.GetMachine(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		machines = append(machines, *m)
	}
	// api-b's agent reports on both: the summary it writes counts only its own entry.
	for _, name := range []string{"api-op-b", "api-op-sel-b"} {
		got, err := b.UpdateOperationStatus(ctx, name, func(op *v1alpha1.MachineOperation) error {
			v1alpha1.SetMachineResult(op, v1alpha1.MachineOperationTarget{Name: "api-b", NodeName: "api-b",
				Phase: v1alpha1.OperationSucceeded, Message: "restarted"}, v1alpha1.TargetNodesOf(op, machines).Check)
			return nil
		})
		if err != nil {
			t.Errorf("node api-b reports on %s: %v", name, err)
			continue
		}
		counted := v1alpha1.Counted(got, v1alpha1.TargetNodesOf(got, machines).Check)
		if len(counted) != 1 || counted[0].NodeName != "api-b" || got.Status.Failed != 0 || got.Status.Done != 1 ||
			got.Status.Phase != v1alpha1.OperationSucceeded {
			t.Errorf("%s: counted %v, summary %s done=%d failed=%d; want only api-b's entry counted, Succeeded",
				name, counted, got.Status.Phase, got.Status.Done, got.Status.Failed)
		}
	}
}

// waitParamCache waits until the admission policy's cache of Machines has Machine machine: agent's dry-run delete
// (nothing is deleted) of a finished operation for machine, with an entry of the agent's node, is refused because
// machine belongs to another node. Only deletes are checked against the Machines.
func waitParamCache(t *testing.T, ctx context.Context, admin, agent *machineapi.Client, machine string) {
	t.Helper()
	name := "api-probe-" + machine
	op := targetedOp(name, machine, nil)
	if _, err := admin.CreateOperation(ctx, op); err != nil {
		t.Fatalf("admin creates %s: %v", name, err)
	}
	defer func() { _ = admin.DeleteOperation(context.WithoutCancel(ctx), name) }()
	if _, err := admin.UpdateOperationStatus(ctx, name, func(op *v1alpha1.MachineOperation) error {
		now := metav1.NewTime(time.Now())
		v1alpha1.SetMachineResult(op, v1alpha1.MachineOperationTarget{Name: machine, NodeName: "api-a",
			Phase: v1alpha1.OperationSucceeded, StartTime: &now, CompletionTime: &now}, nil)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	for {
		err := agent.REST().Delete().Resource(v1alpha1.MachineOperationsResource).Name(name).
			Param("dryRun", "All").Do(ctx).Error()
		if err != nil && strings.Contains(err.Error(), "Machine "+machine+", which belongs to node") {
			t.Logf("timing: the policy's Machine cache caught up in %v", time.Since(t0).Round(time.Millisecond))
			return
		}
		if time.Since(t0) > 30*time.Second {
			t.Fatalf("the policy does not see Machine %s after 30s (last: %v)", machine, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
