package cluster

// Tests of the access control of kubeslot's cluster API against the rig's real kube-apiserver: each agent, acting
// with its node's identity, may create and report on only its own Machine and the operations that target it; and the
// agent's watch helpers.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeslot/kubeslot/integration/kube"
	"github.com/kubeslot/kubeslot/integration/machineapi"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// TestAPIAgentAccess: each agent, with its node's identity, may create and report on only its own Machine and the
// operations that target it, and may change no spec; the cluster admin may do anything.
func TestAPIAgentAccess(t *testing.T) {
	cp := rig.NeedAPI(t)
	ctx := rig.APICtx(t)
	admin := rig.AdminAPI(t, cp)
	a := rig.NodeAPI(t, cp, "api-a")
	b := rig.NodeAPI(t, cp, "api-b")

	// Machines: create only one's own
	labelled := rig.SampleMachine("api-a", "api-a")
	_, err := a.CreateMachine(ctx, labelled)
	rig.WantRejected(t, "api-a creates its own Machine with labels of its choosing", err, apierrors.IsForbidden,
		"ValidatingAdmissionPolicy 'kubeslot-agent-writes'", "node api-a may not create a Machine with metadata.annotations or labels other than kubeslot.dev/enrolled=true")
	annotated := rig.NodeMachine("api-a", "api-a")
	annotated.Annotations = map[string]string{"example.com/x": "y"}
	_, err = a.CreateMachine(ctx, annotated)
	rig.WantRejected(t, "api-a creates its own Machine with an annotation", err, apierrors.IsForbidden, "may not create a Machine with metadata.annotations or labels other than kubeslot.dev/enrolled=true")
	marked := rig.NodeMachine("api-a", "api-a")
	marked.Labels = map[string]string{v1alpha1.LabelEnrolled: "yes"}
	_, err = a.CreateMachine(ctx, marked)
	rig.WantRejected(t, "api-a creates its own Machine with another value of the enrollment mark", err, apierrors.IsForbidden,
		"labels other than kubeslot.dev/enrolled=true")
	ma := rig.NodeMachine("api-a", "api-a")
	ma.Labels = v1alpha1.EnrolledLabels()
	if _, err := a.CreateMachine(ctx, ma); err != nil {
		t.Fatalf("node api-a, enrolled, may create its own Machine with the enrollment mark: %v", err)
	}
	_, err = a.CreateMachine(ctx, rig.NodeMachine("api-b", "api-b"))
	rig.WantRejected(t, "api-a creates api-b's Machine", err, apierrors.IsForbidden,
		"ValidatingAdmissionPolicy 'kubeslot-agent-writes'", `node api-a may create only its own Machine: spec.nodeName must be "api-a", not "api-b"`)
	_, err = a.CreateMachine(ctx, rig.NodeMachine("api-a-2", "api-b"))
	rig.WantRejected(t, "api-a creates a Machine for node api-b", err, apierrors.IsForbidden, "may create only its own Machine")
	fin := rig.NodeMachine("api-c", "api-c")
	fin.Finalizers = []string{"example.com/hold"}
	_, err = rig.NodeAPI(t, cp, "api-c").CreateMachine(ctx, fin)
	rig.WantRejected(t, "api-c creates its Machine with a finalizer", err, apierrors.IsForbidden,
		"node api-c may not create a Machine with metadata.finalizers")
	if _, err := admin.CreateMachine(ctx, rig.SampleMachine("api-b", "api-b")); err != nil {
		t.Fatalf("admin creates Machine api-b: %v", err)
	}
	// A second Machine for the node, under another name: only a cluster admin makes one (checked from the request
	// alone, so it costs the same however many Machines the cluster has: BenchmarkAgentAdmission).
	_, err = a.CreateMachine(ctx, rig.NodeMachine("api-a-2", "api-a"))
	rig.WantRejected(t, "api-a creates a second Machine", err, apierrors.IsForbidden,
		"ValidatingAdmissionPolicy 'kubeslot-agent-writes'", `node api-a may create only the Machine named after it ("api-a"), not "api-a-2"`)
	if _, err := admin.CreateMachine(ctx, rig.SampleMachine("api-d-host", "api-d")); err != nil {
		t.Fatalf("admin creates Machine api-d-host for node api-d: %v", err)
	}
	_, err = rig.NodeAPI(t, cp, "api-d").CreateMachine(ctx, rig.NodeMachine("api-d-2", "api-d"))
	rig.WantRejected(t, "api-d creates a second Machine beside the admin's", err, apierrors.IsForbidden, "may create only the Machine named after it")

	// Machine status: only one's own
	setReady := func(m *v1alpha1.Machine) error {
		m.Status.Phase = v1alpha1.MachineReady
		m.Status.ObservedGeneration = m.Generation
		m.Status.Applied = &v1alpha1.AppliedConfig{KubernetesVersion: "1.37.2", Fingerprint: rig.SampleSHA, Summary: "slot a"}
		return nil
	}
	if got, err := a.UpdateMachineStatus(ctx, "api-a", setReady); err != nil {
		t.Errorf("node api-a may update its Machine's status: %v", err)
	} else if got.Status.Phase != v1alpha1.MachineReady {
		t.Errorf("status not written: %+v", got.Status)
	}
	_, err = a.UpdateMachineStatus(ctx, "api-b", setReady)
	rig.WantRejected(t, "api-a updates api-b's status", err, apierrors.IsForbidden,
		`node api-a may update the status of only its own Machine: Machine api-b has spec.nodeName "api-b"`)

	// No spec changes, no deletes: RBAC refuses them...
	own, err := a.GetMachine(ctx, "api-a")
	if err != nil {
		t.Fatal(err)
	}
	own.Spec.Paused = false
	_, err = a.UpdateMachine(ctx, own)
	rig.WantRejected(t, "api-a changes its own spec", err, apierrors.IsForbidden, `cannot update resource "machines"`)
	err = a.DeleteMachine(ctx, "api-a")
	rig.WantRejected(t, "api-a deletes its Machine", err, apierrors.IsForbidden, `cannot delete resource "machines"`)

	// Operations: admin creates one per target kind
	newOp := func(name, ref string, sel map[string]string) {
		op := targetedOp(name, ref, sel)
		if _, err := admin.CreateOperation(ctx, op); err != nil {
			t.Fatalf("admin creates %s: %v", name, err)
		}
	}
	newOp("api-op-a", "api-a", nil)
	newOp("api-op-b", "api-b", nil)
	newOp("api-op-sel-a", "", map[string]string{"pool": "api-a"})
	newOp("api-op-sel-b", "", map[string]string{"pool": "api-b"})
	_, err = a.CreateOperation(ctx, rig.SampleOperation("api-op-by-agent", v1alpha1.OperationRepave))
	rig.WantRejected(t, "api-a creates an operation", err, apierrors.IsForbidden, `cannot create resource "machineoperations"`)

	now := metav1.NewTime(time.Now().Truncate(time.Second))
	report := func(name, node, phase string) func(*v1alpha1.MachineOperation) error {
		return func(op *v1alpha1.MachineOperation) error {
			v1alpha1.SetMachineResult(op, v1alpha1.MachineOperationTarget{
				Name: name, NodeName: node, Phase: v1alpha1.OperationPhase(phase), Message: "restarting", StartTime: &now,
			}, v1alpha1.CountAll)
			return nil
		}
	}
	// reports on operations that target one's Machine
	for _, name := range []string{"api-op-a", "api-op-sel-a"} {
		got, err := a.UpdateOperationStatus(ctx, name, report("api-a", "api-a", "InProgress"))
		if err != nil {
			t.Errorf("node api-a may report on %s: %v", name, err)
			continue
		}
		if got.Status.Phase != v1alpha1.OperationInProgress || got.Status.Target("api-a", "api-a") == nil {
			t.Errorf("%s: status not written: %+v", name, got.Status)
		}
	}
	if _, err := b.UpdateOperationStatus(ctx, "api-op-b", report("api-b", "api-b", "Succeeded")); err != nil {
		t.Errorf("node api-b may report on api-op-b: %v", err)
	}

	// ... and not on those that target another Machine, where the request alone shows it (a machineRef names the
	// target), nor in another node's name
	_, err = a.UpdateOperationStatus(ctx, "api-op-b", report("api-a", "api-a", "InProgress"))
	rig.WantRejected(t, "api-a reports for itself on an operation for api-b", err, apierrors.IsForbidden,
		"ValidatingAdmissionPolicy 'kubeslot-agent-writes'",
		"MachineOperation api-op-b targets Machine api-b (spec.machineRef); node api-a may not report for another Machine")
	_, err = a.UpdateOperationStatus(ctx, "api-op-b", report("api-b", "api-b", "Failed"))
	rig.WantRejected(t, "api-a changes api-b's entry", err, apierrors.IsForbidden,
		`status.machines: node api-a may add or change only entries with nodeName "api-a"`)
	_, err = a.UpdateOperationStatus(ctx, "api-op-b", func(op *v1alpha1.MachineOperation) error {
		op.Status.Phase = v1alpha1.OperationFailed
		return nil
	})
	rig.WantRejected(t, "api-a changes the summary of api-op-b", err, apierrors.IsForbidden,
		"may change the summary (phase, message, times, conditions) of MachineOperation api-op-b only together with its own entry")

	t.Run("entries under its own node name: admitted, counted by no reader", func(t *testing.T) {
		agentForgedEntries(t, ctx, admin, a, b, report)
	})
	t.Run("deletes finished operations with a TTL", func(t *testing.T) { agentDeletes(t, ctx, admin, a, b) })

	// An identity in system:nodes that is not a node gets nothing: RBAC refuses it here (system:nodes only reads),
	// the policy where RBAC grants more (agentBeyondRBAC).
	_, err = impostorAPI(t, cp).CreateMachine(ctx, rig.NodeMachine("api-impostor", "impostor"))
	rig.WantRejected(t, "a system:nodes member that is not a node creates a Machine", err, apierrors.IsForbidden,
		`User "impostor" cannot create resource "machines"`)

	t.Run("policy holds where RBAC grants more", func(t *testing.T) { agentBeyondRBAC(t, ctx, cp, admin, a) })

	// The admin may do all of it.
	mb, err := admin.GetMachine(ctx, "api-b")
	if err != nil {
		t.Fatal(err)
	}
	mb.Spec.Paused = false
	if _, err := admin.UpdateMachine(ctx, mb); err != nil {
		t.Errorf("admin changes a Machine's spec: %v", err)
	}
	if _, err := admin.UpdateMachineStatus(ctx, "api-a", func(m *v1alpha1.Machine) error {
		m.Status.Phase = v1alpha1.MachineDegraded
		return nil
	}); err != nil {
		t.Errorf("admin updates a Machine's status: %v", err)
	}
	if _, err := admin.UpdateOperationStatus(ctx, "api-op-b", func(op *v1alpha1.MachineOperation) error {
		op.Status.Machines = nil
		op.Status.Phase = v1alpha1.OperationFailed
		op.Status.Message = "cancelled by the admin"
		return nil
	}); err != nil {
		t.Errorf("admin rewrites an operation's status: %v", err)
	}
	for _, name := range []string{"api-op-a", "api-op-b", "api-op-sel-a", "api-op-sel-b"} {
		if err := admin.DeleteOperation(ctx, name); err != nil {
			t.Errorf("admin deletes %s: %v", name, err)
		}
	}
	if err := admin.DeleteMachine(ctx, "api-b"); err != nil {
		t.Errorf("admin deletes a Machine: %v", err)
	}
}

// agentDeletes: a node may delete an operation only when it asks for it (spec.ttlSecondsAfterFinished), is finished
// (with completionTime) and is one of its own Machine's (machineRef, or an entry of its node for that Machine);
// refused otherwise, by whichever policy catches it. The admin may delete anything. Machines api-a and api-b exist and
// the policy's Machine cache has them.
func agentDeletes(t *testing.T, ctx context.Context, admin, a, b *machineapi.Client) {
	// The policy with Machines as parameters reads them from the apiserver's cache: wait until it has api-b (and so
	// api-a, written before it), so that what follows tests the policy and not the cache's lag.
	waitParamCache(t, ctx, admin, a, "api-b")
	newOp := func(name, ref string, sel map[string]string, ttl bool) {
		t.Helper()
		op := targetedOp(name, ref, sel)
		if !ttl {
			op.Spec.TTLSecondsAfterFinished = nil
		}
		if _, err := admin.CreateOperation(ctx, op); err != nil {
			t.Fatalf("admin creates %s: %v", name, err)
		}
		t.Cleanup(func() { _ = admin.DeleteOperation(context.WithoutCancel(ctx), name) })
	}
	// report writes, as c, the entry of Machine machine on node node; finished entries carry a completionTime.
	report := func(c *machineapi.Client, opName, machine, node string, phase v1alpha1.OperationPhase) {
		t.Helper()
		now := metav1.NewTime(time.Now().Truncate(time.Second))
		e := v1alpha1.MachineOperationTarget{Name: machine, NodeName: node, Phase: phase, Message: "test", StartTime: &now}
		if phase.Finished() {
			e.CompletionTime = &now
		}
		got, err := c.UpdateOperationStatus(ctx, opName, func(op *v1alpha1.MachineOperation) error {
			v1alpha1.SetMachineResult(op, e, nil)
			return nil
		})
		if err != nil {
			t.Fatalf("report %s on %s for %s/%s: %v", phase, opName, machine, node, err)
		}
		if phase.Finished() && (got.Status.Phase != phase || got.Status.CompletionTime == nil) {
			t.Fatalf("%s: summary %+v, want %s with a completionTime", opName, got.Status, phase)
		}
	}
	// del deletes name as c with the preconditions the watcher uses (UID and resourceVersion as just read).
	del := func(c *machineapi.Client, name string) error {
		op, err := admin.GetOperation(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return c.DeleteFinishedOperation(ctx, name, op.UID, op.ResourceVersion)
	}
	gone := func(name string) {
		t.Helper()
		if _, err := admin.GetOperation(ctx, name); !apierrors.IsNotFound(err) {
			t.Errorf("%s: %v, want it deleted", name, err)
		}
	}

	// Its own finished operations: by machineRef and by selector; Failed counts as finished.
	newOp("api-del-a", "api-a", nil, true)
	report(a, "api-del-a", "api-a", "api-a", v1alpha1.OperationSucceeded)
	newOp("api-del-sel-a", "", map[string]string{"pool": "api-a"}, true)
	report(a, "api-del-sel-a", "api-a", "api-a", v1alpha1.OperationFailed)
	newOp("api-del-b", "api-b", nil, true)
	report(b, "api-del-b", "api-b", "api-b", v1alpha1.OperationSucceeded)
	newOp("api-del-sel-b", "", map[string]string{"pool": "api-b"}, true)
	report(b, "api-del-sel-b", "api-b", "api-b", v1alpha1.OperationSucceeded)

	// The preconditions hold the delete to the version read.
	op, err := admin.GetOperation(ctx, "api-del-a")
	if err != nil {
		t.Fatal(err)
	}
	err = a.DeleteFinishedOperation(ctx, "api-del-a", op.UID, "1")
	rig.WantRejected(t, "api-a deletes api-del-a at an older resourceVersion", err, apierrors.IsConflict, "api-del-a")
	err = a.DeleteFinishedOperation(ctx, "api-del-a", "00000000-0000-0000-0000-000000000000", op.ResourceVersion)
	rig.WantRejected(t, "api-a deletes api-del-a under another UID", err, apierrors.IsConflict, "api-del-a")

	// Another node's, whichever way it targets: refused, by the entry check (no entry of api-a)...
	err = del(a, "api-del-b")
	wantRejectedBy(t, "api-a deletes api-b's finished operation (machineRef)", err, apierrors.IsForbidden,
		[]string{"ValidatingAdmissionPolicy 'kubeslot-agent-writes'",
			`node api-a may not delete MachineOperation api-del-b: status.machines has no entry of node "api-a" for Machine api-b (spec.machineRef)`},
		[]string{"ValidatingAdmissionPolicy 'kubeslot-agent-operation-targets'",
			`node api-a may not delete MachineOperation api-del-b: it is for Machine api-b, which belongs to node "api-b"`})
	// ... and, where an entry under api-a's name names api-b's Machine (api-a may write it: status writes are checked
	// from the request alone), by the Machine.
	for _, name := range []string{"api-del-b"} {
		report(a, name, "api-b", "api-a", v1alpha1.OperationSucceeded)
		err = del(a, name)
		rig.WantRejected(t, "api-a deletes "+name+" through an entry of its node for api-b's Machine", err, apierrors.IsForbidden,
			"ValidatingAdmissionPolicy 'kubeslot-agent-operation-targets'",
			"node api-a may not delete MachineOperation "+name+`: it is for Machine api-b, which belongs to node "api-b"`)
	}

	// Not finished, or finished without completionTime, or no TTL: refused even for its own.
	newOp("api-del-running", "api-a", nil, true)
	report(a, "api-del-running", "api-a", "api-a", v1alpha1.OperationInProgress)
	err = del(a, "api-del-running")
	rig.WantRejected(t, "api-a deletes its unfinished operation", err, apierrors.IsForbidden,
		`node api-a may not delete MachineOperation api-del-running: it is not finished (status.phase "InProgress", no status.completionTime)`)
	if _, err := a.UpdateOperationStatus(ctx, "api-del-running", func(op *v1alpha1.MachineOperation) error {
		v1alpha1.SetMachineResult(op, v1alpha1.MachineOperationTarget{Name: "api-a", NodeName: "api-a", Phase: v1alpha1.OperationSucceeded}, nil)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	err = del(a, "api-del-running")
	rig.WantRejected(t, "api-a deletes its operation finished without completionTime", err, apierrors.IsForbidden,
		`it is not finished (status.phase "Succeeded", no status.completionTime)`)
	newOp("api-del-nottl", "api-a", nil, false)
	report(a, "api-del-nottl", "api-a", "api-a", v1alpha1.OperationSucceeded)
	err = del(a, "api-del-nottl")
	rig.WantRejected(t, "api-a deletes its finished operation without a TTL", err, apierrors.IsForbidden,
		"node api-a may not delete MachineOperation api-del-nottl: it has no spec.ttlSecondsAfterFinished")
	newOp("api-del-untouched", "api-a", nil, true)
	if _, err := admin.UpdateOperationStatus(ctx, "api-del-untouched", func(op *v1alpha1.MachineOperation) error {
		now := metav1.NewTime(time.Now())
		op.Status.Phase, op.Status.CompletionTime, op.Status.Message = v1alpha1.OperationFailed, &now, "cancelled by the admin"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	err = del(a, "api-del-untouched")
	rig.WantRejected(t, "api-a deletes an operation for its Machine that it took no part in", err, apierrors.IsForbidden,
		`status.machines has no entry of node "api-a" for Machine api-a (spec.machineRef)`)

	// A selector operation: no node deletes one, not even a target with its finished entry, nor a node that forged
	// an entry (and the summary) under its own name: admission cannot tell a target from a node that is none.
	report(a, "api-del-sel-b", "api-outsider", "api-a", v1alpha1.OperationSucceeded)
	for _, d := range []struct {
		c          *machineapi.Client
		node, name string
	}{{a, "api-a", "api-del-sel-a"}, {b, "api-b", "api-del-sel-b"}, {a, "api-a", "api-del-sel-b"}} {
		err = del(d.c, d.name)
		rig.WantRejected(t, "node "+d.node+" deletes selector operation "+d.name, err, apierrors.IsForbidden,
			"node "+d.node+" may not delete MachineOperation "+d.name+": it selects its Machines by label")
	}

	// The one that qualifies: its own Machine's, by its node.
	if err := del(a, "api-del-a"); err != nil {
		t.Errorf("node api-a may delete its finished operation api-del-a: %v", err)
	}
	gone("api-del-a")
	if err := a.DeleteFinishedOperation(ctx, "api-del-a", op.UID, op.ResourceVersion); !apierrors.IsNotFound(err) {
		t.Errorf("deleting api-del-a again: %v, want not found (another target won)", err)
	}

	// The admin: anything, finished or not, with or without a TTL, anyone's.
	for _, name := range []string{"api-del-running", "api-del-nottl", "api-del-b", "api-del-untouched", "api-del-sel-a", "api-del-sel-b"} {
		if err := admin.DeleteOperation(ctx, name); err != nil {
			t.Errorf("admin deletes %s: %v", name, err)
		}
		gone(name)
	}
}

// agentBeyondRBAC grants node api-a every verb on kubeslot.dev through RBAC, as a careless cluster might, and checks
// that the admission policy still refuses spec changes, deletes and new operations.
func agentBeyondRBAC(t *testing.T, ctx context.Context, cp *kube.ControlPlane, admin, a *machineapi.Client) {
	cs, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	const name = "api-test-nodes-get-everything"
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.GroupName}, Resources: []string{"*"}, Verbs: []string{"*"}}},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: v1alpha1.AgentUsername("api-a")},
			{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "impostor"}},
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = cs.RbacV1().ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// RBAC reaches the authorizer's cache a moment after the write: until then RBAC itself refuses. Each attempt is
	// refused either way (nothing is written); what is waited for is the policy's own message.
	eventuallyDeniedBy := func(what, want string, try func() error) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := try()
			if err == nil {
				t.Errorf("%s: admitted, want refused by the admission policy", what)
				return
			}
			if strings.Contains(err.Error(), want) {
				t.Logf("%s: refused as expected: %v", what, err)
				return
			}
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "cannot ") || time.Now().After(deadline) {
				t.Errorf("%s: %v\nwant a message containing %q", what, err, want)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	eventuallyDeniedBy("api-a changes its own spec", "node api-a may not change Machine api-a: spec and metadata are written by cluster admins", func() error {
		m, err := a.GetMachine(ctx, "api-a")
		if err != nil {
			return err
		}
		m.Spec.Paused = false
		_, err = a.UpdateMachine(ctx, m)
		return err
	})
	eventuallyDeniedBy("api-a deletes its Machine", "node api-a may not delete Machine api-a", func() error {
		return a.DeleteMachine(ctx, "api-a")
	})
	eventuallyDeniedBy("api-a creates an operation", "may not create MachineOperation api-op-by-agent", func() error {
		op := rig.SampleOperation("api-op-by-agent", v1alpha1.OperationRepave)
		op.Spec.MachineRef.Name = "api-a"
		_, err := a.CreateOperation(ctx, op)
		return err
	})
	eventuallyDeniedBy("api-a relabels an operation for it", "may not change MachineOperation api-op-a", func() error {
		op, err := a.GetOperation(ctx, "api-op-a")
		if err != nil {
			return err
		}
		op.Labels = map[string]string{"mine": "yes"}
		_, err = a.UpdateOperation(ctx, op)
		return err
	})
	eventuallyDeniedBy("api-a deletes an operation for it", "may not delete MachineOperation api-op-a", func() error {
		return a.DeleteOperation(ctx, "api-op-a")
	})
	imp := impostorAPI(t, cp)
	eventuallyDeniedBy("a system:nodes member that is not a node creates a Machine", "user impostor is in group system:nodes but is not a node identity", func() error {
		_, err := imp.CreateMachine(ctx, rig.NodeMachine("api-impostor", "impostor"))
		return err
	})
}

// impostorAPI is a client of an identity in group system:nodes that is not a node (user "impostor").
func impostorAPI(t *testing.T, cp *kube.ControlPlane) *machineapi.Client {
	t.Helper()
	cert, key, err := cp.ClientCert("impostor", v1alpha1.NodesGroup)
	if err != nil {
		t.Fatal(err)
	}
	imp, err := machineapi.New(cp.CertConfig(cert, key))
	if err != nil {
		t.Fatal(err)
	}
	return imp
}

// rig.WantRejected checks that err is of the expected kind and that its message contains every one of want.
// TestAPIWatchHelpers: an agent gets its Machine's events only, and the operations that target it.
func TestAPIWatchHelpers(t *testing.T) {
	cp := rig.NeedAPI(t)
	ctx := rig.APICtx(t)
	admin := rig.AdminAPI(t, cp)
	w := rig.NodeAPI(t, cp, "api-w")

	if _, err := w.CreateMachine(ctx, rig.NodeMachine("api-w", "api-w")); err != nil {
		t.Fatal(err)
	}
	// The cluster admin labels and enrolls the Machine the node registered, so that a selector can target it.
	own, err := admin.GetMachine(ctx, "api-w")
	if err != nil {
		t.Fatal(err)
	}
	own.Labels = map[string]string{"pool": "api-w"}
	if _, err := admin.UpdateMachine(ctx, own); err != nil {
		t.Fatal(err)
	}
	rig.Enroll(t, ctx, cp, "api-w")
	if _, err := admin.CreateMachine(ctx, rig.SampleMachine("api-w-other", "api-w-other")); err != nil {
		t.Fatal(err)
	}
	mw, err := w.WatchMachine(ctx, "api-w", "")
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Stop()
	m, err := w.GetMachine(ctx, "api-w")
	if err != nil {
		t.Fatal(err)
	}
	ow, err := w.WatchOperationsFor(ctx, m, "")
	if err != nil {
		t.Fatal(err)
	}
	defer ow.Stop()

	// changes to the other Machine, then to this one
	for _, name := range []string{"api-w-other", "api-w"} {
		if _, err := admin.UpdateMachineStatus(ctx, name, func(m *v1alpha1.Machine) error {
			m.Status.AgentVersion = "watched"
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	op := func(name, ref string, sel map[string]string) {
		if _, err := admin.CreateOperation(ctx, targetedOp(name, ref, sel)); err != nil {
			t.Fatal(err)
		}
	}
	op("api-w-op-other", "api-w-other", nil)
	op("api-w-op-ref", "api-w", nil)
	op("api-w-op-sel-other", "", map[string]string{"pool": "api-w-other"})
	op("api-w-op-sel", "", map[string]string{"pool": "api-w"})

	// the Machine watch: ADDED (initial state) for api-w, then MODIFIED for api-w; never api-w-other
	seen := collect(t, mw, 2, func(ev watch.Event) string {
		m := ev.Object.(*v1alpha1.Machine)
		return fmt.Sprintf("%s %s %s", ev.Type, m.Name, m.Status.AgentVersion)
	})
	if want := []string{"ADDED api-w ", "MODIFIED api-w watched"}; strings.Join(seen, "|") != strings.Join(want, "|") {
		t.Errorf("Machine watch saw %q, want %q", seen, want)
	}
	seen = collect(t, ow, 2, func(ev watch.Event) string {
		return fmt.Sprintf("%s %s", ev.Type, ev.Object.(*v1alpha1.MachineOperation).Name)
	})
	if want := []string{"ADDED api-w-op-ref", "ADDED api-w-op-sel"}; strings.Join(seen, "|") != strings.Join(want, "|") {
		t.Errorf("operation watch saw %q, want %q", seen, want)
	}
	if found, err := w.MachineForNode(ctx, "api-w"); err != nil || found.Name != "api-w" {
		t.Errorf("MachineForNode(api-w) = %v, %v", found, err)
	}
	if _, err := w.MachineForNode(ctx, "api-w-nobody"); !apierrors.IsNotFound(err) {
		t.Errorf("MachineForNode of a node without a Machine: %v, want NotFound", err)
	}
	ops, rv, err := w.OperationsFor(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range ops {
		names = append(names, o.Name)
	}
	if strings.Join(names, ",") != "api-w-op-ref,api-w-op-sel" || rv == "" {
		t.Errorf("OperationsFor = %v (rv %q), want api-w-op-ref, api-w-op-sel", names, rv)
	}
}

// collect reads n non-bookmark events from w, bounded by 30 s.
func collect(t *testing.T, w watch.Interface, n int, show func(watch.Event) string) []string {
	t.Helper()
	var out []string
	timeout := time.After(30 * time.Second)
	for len(out) < n {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch closed after %q", out)
			}
			switch ev.Type {
			case watch.Bookmark:
				continue
			case watch.Error:
				t.Fatalf("watch error: %v", apierrors.FromObject(ev.Object))
			}
			out = append(out, show(ev))
		case <-timeout:
			t.Fatalf("watch: only %q after 30s, want %d events", out, n)
		}
	}
	// nothing else should arrive for what the filter drops; a short look, not a timing assertion
	select {
	case ev := <-w.ResultChan():
		if ev.Type != watch.Bookmark {
			t.Errorf("unexpected extra event: %s", show(ev))
		}
	case <-time.After(500 * time.Millisecond):
	}
	return out
}

// targetedOp is a NodeRestart operation for Machine ref, or for the Machines sel picks when ref is empty.
func targetedOp(name, ref string, sel map[string]string) *v1alpha1.MachineOperation {
	op := rig.SampleOperation(name, v1alpha1.OperationNodeRestart)
	op.Spec.MachineRef = nil
	if ref != "" {
		op.Spec.MachineRef = &v1alpha1.MachineReference{Name: ref}
	} else {
		op.Spec.MachineSelector = &v1alpha1.MachineSelector{MatchLabels: sel}
	}
	return op
}

// wantRejectedBy is rig.WantRejected for a request that more than one policy refuses: the apiserver reports whichever
// refusal it met first, so err must contain every string of one of the alternatives.
func wantRejectedBy(t *testing.T, what string, err error, kind func(error) bool, alternatives ...[]string) {
	t.Helper()
	for _, alt := range alternatives {
		if err != nil && kind(err) && rig.ContainsAll(err.Error(), alt) {
			t.Logf("%s: refused: %v", what, err)
			return
		}
	}
	rig.WantRejected(t, what, err, kind, alternatives[0]...)
}
