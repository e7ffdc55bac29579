package rollout

// Each test here but the last plays a node that is enrolled (it may write) but no target of the rollout, with its
// own real node credentials, and forges what admission lets such a node write. It can write entries under its own
// node name into any operation's status.machines and its summary (admission checks status writes from the request
// alone: DESIGN.md, "Admission cost"), create RolloutLeases in its own name, and create its own Machine. What keeps
// each from steering a rollout: every reader counts only entries whose Machine is an enrolled target with that node
// name, sizes the rollout from its own List of those targets, counts only leases of the slots' shape held by a
// target, and only an administrator labels a Machine. The last plays a node no administrator enrolled: it writes
// nothing at all.

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"

	"github.com/kubeslot/kubeslot/integration/fleet"
	"github.com/kubeslot/kubeslot/integration/machineapi"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/clusterinstall"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/rollout"
	"github.com/kubeslot/kubeslot/lib/watcher"
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
	forger := rig.NodeAPI(t, h.cp, outsider)
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
		t.Fatalf("the forger's summary: %s, want its own Halted with 2 failed (what a reader must not believe)", rig.DescribeOp(got))
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
		t.Errorf("final summary: %s, want 0 failed, 0 waiting and the 3 forged entries said not counted", rig.DescribeOp(op))
	}
	if len(op.Status.Machines) != 6 {
		t.Errorf("%d entries, want the 3 targets' and the 3 forged ones kept (no agent may remove another node's): %s",
			len(op.Status.Machines), rig.DescribeOp(op))
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

// TestRolloutForgedMachine: a node that is no target tries to make itself one. Its own Machine with the fleet's
// labels (and the enrollment mark) is refused; so is a later label of its own. The unlabelled Machine it may create
// is matched by no selector, and the Succeeded entry it writes for it passes no canary: with canary 1 and
// maxUnavailable 3, the first target still runs alone, and the rollout ends with the three real targets done.
func TestRolloutForgedMachine(t *testing.T) {
	h := newRolloutFleet(t, "ro8", 3)
	const outsider = "ro8-outsider"
	forger := rig.NodeAPI(t, h.cp, outsider)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	m := rig.NodeMachine(outsider, outsider)
	m.Labels = map[string]string{"rollout": "ro8", "order": "0", v1alpha1.LabelEnrolled: "true"}
	_, err := forger.CreateMachine(ctx, m)
	rig.WantRejected(t, "the outsider creates its Machine with the rollout's labels", err, apierrors.IsForbidden,
		"may not create a Machine with metadata.annotations or labels other than kubeslot.dev/enrolled=true")
	own, err := forger.CreateMachine(ctx, rig.NodeMachine(outsider, outsider))
	if err != nil {
		t.Fatalf("the outsider creates its own Machine without labels: %v", err)
	}
	t.Cleanup(func() { _ = h.admin.DeleteMachine(context.Background(), outsider) })
	own.Labels = map[string]string{"rollout": "ro8", v1alpha1.LabelEnrolled: "true"}
	_, err = forger.UpdateMachine(ctx, own)
	rig.WantRejected(t, "the outsider labels its own Machine", err, apierrors.IsForbidden, "forbidden")

	h.pacedOperation("ro8-repave", "ro8", v1alpha1.Rollout{Canary: 1, MaxUnavailable: &intstr.IntOrString{IntVal: 3}, Paused: true})
	h.waitOp("ro8-repave", time.Minute, "three targets Waiting (paused)", func(op *v1alpha1.MachineOperation) bool {
		return op.Status.Waiting == 3
	})
	_, err = forger.UpdateOperationStatus(ctx, "ro8-repave", func(op *v1alpha1.MachineOperation) error {
		v1alpha1.SetMachineResult(op, v1alpha1.MachineOperationTarget{Name: outsider, NodeName: outsider,
			Phase: v1alpha1.OperationSucceeded, Message: "forged canary"}, v1alpha1.CountAll)
		return nil
	})
	if err != nil {
		t.Fatalf("the outsider writes a Succeeded entry for its own Machine: %v (admission checks only the node name)", err)
	}
	h.unpause("ro8-repave")
	op := h.waitOp("ro8-repave", 3*time.Minute, "Succeeded with 3 done", func(op *v1alpha1.MachineOperation) bool {
		return op.Status.Phase == v1alpha1.OperationSucceeded && op.Status.Done == 3
	})
	// The canary alone, then the other two together: a canary the forged success had passed lets all three at once.
	if p := h.peak.Load(); p > 2 {
		t.Errorf("%d requests ran at once: the forged success passed the canary (want the canary alone first)", p)
	}
	if !strings.Contains(op.Status.Message, "1 entries not counted") {
		t.Errorf("final summary %s: want the forged entry said not counted", rig.DescribeOp(op))
	}
}

// TestRolloutForgedCountAndLeases: a node of the fleet that is no target of this rollout (enrolled, in another pool)
// inflates status.targets from 3 to 400 (with maxUnavailable 25 %, 100 slots instead of 1) and squats the rollout's
// slots with leases of its own: slot 0 without an owner, and a lease of a name no slot has, both for an hour. The
// agents size the rollout from their own List of the enrolled targets and count neither lease: one target at a time,
// and the rollout finishes.
func TestRolloutForgedCountAndLeases(t *testing.T) {
	h := newRolloutFleet(t, "ro9", 3)
	const outsider = "ro9-outsider"
	forger := h.fleetOutsider(outsider)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	quarter := intstr.FromString("25%")
	h.pacedOperation("ro9-repave", "ro9", v1alpha1.Rollout{MaxUnavailable: &quarter, Paused: true})
	op := h.waitOp("ro9-repave", time.Minute, "three targets Waiting (paused)", func(op *v1alpha1.MachineOperation) bool {
		return op.Status.Waiting == 3
	})
	_, err := forger.UpdateOperationStatus(ctx, "ro9-repave", func(op *v1alpha1.MachineOperation) error {
		v1alpha1.SetMachineResult(op, v1alpha1.MachineOperationTarget{Name: outsider, NodeName: outsider,
			Phase: v1alpha1.OperationWaiting, Message: "forged"}, v1alpha1.CountAll)
		op.Status.Targets = 400
		return nil
	})
	if err != nil {
		t.Fatalf("the outsider rewrites status.targets with an entry of its own: %v", err)
	}
	leases := rollout.REST{Client: forger.REST()}
	squat := func(name string, owned bool) {
		t.Helper()
		l := &v1alpha1.RolloutLease{Spec: v1alpha1.RolloutLeaseSpec{HolderIdentity: outsider, LeaseDurationSeconds: 3600}}
		l.Name, l.Labels = name, map[string]string{v1alpha1.LabelOperation: "ro9-repave"}
		if owned {
			l.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1alpha1.SchemeGroupVersion.String(),
				Kind: "MachineOperation", Name: op.Name, UID: op.UID}}
		}
		if _, err := leases.Create(ctx, l); err != nil {
			t.Fatalf("the outsider creates lease %s in its own name: %v (admission checks only the holder)", name, err)
		}
		t.Cleanup(func() { adminDeleteLease(h.admin, name) })
	}
	squat(rollout.Name("ro9-repave", 0), false)
	squat("ro9-repave-anything", true)

	h.unpause("ro9-repave")
	op = h.waitOp("ro9-repave", 3*time.Minute, "Succeeded with 3 done", func(op *v1alpha1.MachineOperation) bool {
		return op.Status.Phase == v1alpha1.OperationSucceeded && op.Status.Done == 3
	})
	if p := h.peak.Load(); p != 1 {
		t.Errorf("%d requests ran at once, want 1 (25%% of the 3 enrolled targets; status.targets said 400)", p)
	}
	for _, a := range h.agents {
		if n := a.ran.Load(); n != 1 {
			t.Errorf("%s ran %d requests, want 1", a.name, n)
		}
	}
}

// unpause sets spec.rollout.paused false, as the cluster admin.
func (h *roHarness) unpause(name string) {
	h.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		op, err := h.admin.GetOperation(context.Background(), name)
		if err != nil {
			return err
		}
		op.Spec.Rollout.Paused = false
		_, err = h.admin.UpdateOperation(context.Background(), op)
		return err
	})
	if err != nil {
		h.t.Fatalf("unpause %s: %v", name, err)
	}
}

// TestRolloutSlotTakenOver: a node of the fleet that is no target of this rollout takes a target's live slot over in its own name (admission
// allows any node to write a lease in its own name) and deletes it, so that the next target gets the slot while the
// victim still runs. The victim's watcher finds the slot lost at its next renewal and tells its worker, which stops
// before its point of no return and says so on its entry; the other target then runs, and the rollout ends.
func TestRolloutSlotTakenOver(t *testing.T) {
	h := newRolloutFleet(t, "ro10", 2)
	holds := map[string]chan struct{}{}
	for _, a := range h.agents {
		holds[a.name] = make(chan struct{})
		a.hold = holds[a.name]
	}
	const outsider = "ro10-outsider"
	forger := rollout.REST{Client: h.fleetOutsider(outsider).REST()}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var never int32
	h.pacedOperation("ro10-repave", "ro10", v1alpha1.Rollout{MaxUnavailable: &intstr.IntOrString{IntVal: 1}, FailureBudget: &never})

	// The victim: whoever holds slot 0 and runs.
	var victim *roAgent
	var lease *v1alpha1.RolloutLease
	deadline := time.Now().Add(time.Minute)
	for victim == nil {
		if time.Now().After(deadline) {
			t.Fatalf("no target took slot 0 and ran within a minute; leases %v", rollout.Names(h.leases("ro10-repave")))
		}
		time.Sleep(100 * time.Millisecond)
		l, err := forger.Get(ctx, rollout.Name("ro10-repave", 0))
		if err != nil {
			continue
		}
		for _, a := range h.agents {
			if a.name == l.Spec.HolderIdentity && a.running.Load() {
				victim, lease = a, l
			}
		}
	}
	taken := lease.DeepCopy()
	taken.Spec.HolderIdentity = outsider
	taken, err := forger.Update(ctx, taken)
	if err != nil {
		t.Fatalf("the outsider takes %s's live slot over in its own name: %v (admission checks only the new holder)", victim.name, err)
	}
	if err := forger.Delete(ctx, taken.Name, taken.ResourceVersion); err != nil {
		t.Fatalf("the outsider deletes the slot it now holds: %v", err)
	}

	// The victim's worker is told before its point of no return.
	dir := requests.New(victim.root)
	var lost *requests.SlotLost
	deadline = time.Now().Add(time.Minute)
	for lost == nil && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		sts, _, _ := dir.ListStatus()
		for _, s := range sts {
			if s.Operation == "ro10-repave" {
				lost, _ = dir.ReadSlotLost(s.RequestID)
			}
		}
	}
	if lost == nil {
		t.Fatalf("%s's watcher did not tell its worker the slot was lost within a minute", victim.name)
	}
	t.Logf("%s's worker was told: %s", victim.name, lost.Reason)
	for _, c := range holds {
		close(c)
	}
	op := h.waitOp("ro10-repave", 2*time.Minute, "both entries finished", func(op *v1alpha1.MachineOperation) bool {
		return op.Status.Done+op.Status.Failed == 2
	})
	for _, e := range op.Status.Machines {
		switch {
		case e.Name == victim.name && (e.Phase != v1alpha1.OperationFailed || !strings.Contains(e.Message, "rollout slot was lost")):
			t.Errorf("the victim's entry: %s %q, want Failed, saying its slot was lost", e.Phase, e.Message)
		case e.Name != victim.name && e.NodeName != outsider && e.Phase != v1alpha1.OperationSucceeded:
			t.Errorf("the other target's entry: %s %q, want Succeeded", e.Phase, e.Message)
		}
	}
}

// TestRolloutForgedDelete: a node that is no target writes a Succeeded entry under its own name (and the summary
// that follows from it) into a rollout in flight that asks to be deleted a second after it finishes, then deletes
// it: refused, as it is for a target, since no node can show admission it is one. `kubeslot cluster expire`, the
// cluster side's TTL, leaves it while its targets wait, and deletes it once they have finished and its TTL passed.
func TestRolloutForgedDelete(t *testing.T) {
	h := newRolloutFleet(t, "ro11", 2)
	const outsider = "ro11-outsider"
	forger := rig.NodeAPI(t, h.cp, outsider)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	op := &v1alpha1.MachineOperation{Spec: v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationRepave,
		MachineSelector: &v1alpha1.MachineSelector{MatchLabels: map[string]string{"rollout": "ro11"}},
		Rollout:         &v1alpha1.Rollout{Paused: true}, TTLSecondsAfterFinished: ptrInt32(1)}}
	op.Name = "ro11-repave"
	if _, err := h.admin.CreateOperation(ctx, op); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.admin.DeleteOperation(context.Background(), op.Name) })
	h.waitOp(op.Name, time.Minute, "two targets Waiting (paused)", func(op *v1alpha1.MachineOperation) bool { return op.Status.Waiting == 2 })

	now := metav1.NewTime(time.Now().Add(-time.Hour))
	got, err := forger.UpdateOperationStatus(ctx, op.Name, func(op *v1alpha1.MachineOperation) error {
		v1alpha1.SetMachineResult(op, v1alpha1.MachineOperationTarget{Name: outsider, NodeName: outsider,
			Phase: v1alpha1.OperationSucceeded, CompletionTime: &now, Message: "forged"}, nil)
		return nil
	})
	if err != nil {
		t.Fatalf("the outsider writes a finished entry of its own: %v", err)
	}
	if got.Status.Phase != v1alpha1.OperationSucceeded || got.Status.CompletionTime == nil {
		t.Fatalf("the forged summary: %s, want Succeeded with a completionTime (what the delete rule once read)", rig.DescribeOp(got))
	}
	err = forger.DeleteFinishedOperation(ctx, op.Name, got.UID, got.ResourceVersion)
	rig.WantRejected(t, "the outsider deletes the rollout in flight", err, apierrors.IsForbidden,
		"node "+outsider+" may not delete MachineOperation "+op.Name+": it selects its Machines by label")

	bin := rig.BuildKubeslot(t)
	if stdout, _, code := rig.RunCLI(t, ctx, h.cp, bin, "cluster", "expire"); code != 0 || strings.Contains(stdout, op.Name) {
		t.Fatalf("kubeslot cluster expire while the targets wait: exit %d, %q; want the operation kept", code, stdout)
	}
	if _, err := h.admin.GetOperation(ctx, op.Name); err != nil {
		t.Fatalf("the rollout in flight is gone: %v", err)
	}
	h.unpause(op.Name)
	h.waitOp(op.Name, 2*time.Minute, "both targets done", func(op *v1alpha1.MachineOperation) bool { return op.Status.Done == 2 })
	time.Sleep(1500 * time.Millisecond) // its TTL
	if stdout, _, code := rig.RunCLI(t, ctx, h.cp, bin, "cluster", "expire"); code != 0 || !strings.Contains(stdout, "deleted   "+op.Name) {
		t.Errorf("kubeslot cluster expire after the TTL: exit %d, %q; want %s deleted", code, stdout, op.Name)
	}
	if _, err := h.admin.GetOperation(ctx, op.Name); !apierrors.IsNotFound(err) {
		t.Errorf("after the expiry: %v, want the operation gone", err)
	}
}

// fleetOutsider enrolls a Machine for node name in another pool, as the cluster admin, and returns a client with that
// node's credentials: a fleet member that no operation of the harness targets. A node no administrator enrolled may
// not write a RolloutLease at all (TestRolloutAPI).
func (h *roHarness) fleetOutsider(name string) *machineapi.Client {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m := rig.SampleMachine(name, name)
	m.Labels = map[string]string{"pool": "elsewhere"}
	if _, err := h.admin.CreateMachine(ctx, m); err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = h.admin.DeleteMachine(context.Background(), name) })
	rig.Enroll(h.t, ctx, h.cp, name)
	c := rig.NodeAPI(h.t, h.cp, name)
	// The binding is in force once a dry-run create of a lease in its own name goes through.
	deadline := time.Now().Add(time.Minute)
	for {
		l := &v1alpha1.RolloutLease{Spec: v1alpha1.RolloutLeaseSpec{HolderIdentity: name, LeaseDurationSeconds: 1}}
		l.Name = name + "-probe"
		err := c.REST().Post().Resource(v1alpha1.RolloutLeasesResource).Param("dryRun", "All").Body(l).Do(ctx).Error()
		if err == nil {
			return c
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("node %s enrolled, but still may not create a RolloutLease: %v", name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestNotEnrolledNodeOnlyReads: a node no administrator enrolled, with its own real node credentials, reads kubeslot's
// objects and writes none of them: it cannot register its Machine (with or without the enrollment mark), report on a
// Machine an admin made for it, write an entry into an operation that names it, delete that operation once finished,
// or take a rollout slot. Its agent (the watcher's own loop) keeps trying and registers the Machine, enrolled, as soon
// as an administrator enrolls the node (kubeslot cluster enroll, before any Machine exists).
func TestNotEnrolledNodeOnlyReads(t *testing.T) {
	cp := rig.NeedAPI(t)
	ctx := rig.APICtx(t)
	admin := rig.AdminAPI(t, cp)
	const stranger = "ne-stranger"
	s := rig.OutsiderAPI(t, cp, stranger)
	rbac := func(verb, resource string) string {
		return `User "system:node:` + stranger + `" cannot ` + verb + ` resource "` + resource + `"`
	}

	if _, err := s.ListOperations(ctx); err != nil {
		t.Errorf("a node that is not enrolled may still read operations: %v", err)
	}
	m := rig.NodeMachine(stranger, stranger)
	m.Labels = v1alpha1.EnrolledLabels()
	_, err := s.CreateMachine(ctx, m)
	rig.WantRejected(t, "the stranger registers its Machine with the enrollment mark", err, apierrors.IsForbidden, rbac("create", "machines"))
	_, err = s.CreateMachine(ctx, rig.NodeMachine(stranger, stranger))
	rig.WantRejected(t, "the stranger registers its Machine", err, apierrors.IsForbidden, rbac("create", "machines"))

	if _, err := admin.CreateMachine(ctx, rig.NodeMachine(stranger, stranger)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.DeleteMachine(context.Background(), stranger) })
	_, err = s.UpdateMachineStatus(ctx, stranger, func(m *v1alpha1.Machine) error {
		m.Status.Phase = v1alpha1.MachineReady
		return nil
	})
	rig.WantRejected(t, "the stranger reports on the Machine an admin made for it", err, apierrors.IsForbidden, rbac("patch", "machines/status"))

	op := rig.SampleOperation("ne-restart", v1alpha1.OperationNodeRestart)
	op.Spec.MachineRef = &v1alpha1.MachineReference{Name: stranger}
	if _, err := admin.CreateOperation(ctx, op); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.DeleteOperation(context.Background(), op.Name) })
	_, err = s.UpdateOperationStatus(ctx, op.Name, func(o *v1alpha1.MachineOperation) error {
		now := metav1.Now()
		v1alpha1.SetMachineResult(o, v1alpha1.MachineOperationTarget{Name: stranger, NodeName: stranger,
			Phase: v1alpha1.OperationSucceeded, StartTime: &now, CompletionTime: &now}, v1alpha1.CountAll)
		return nil
	})
	rig.WantRejected(t, "the stranger writes its entry into an operation that names its Machine", err, apierrors.IsForbidden,
		rbac("patch", "machineoperations/status"))
	if _, err := admin.UpdateOperationStatus(ctx, op.Name, func(o *v1alpha1.MachineOperation) error {
		now := metav1.Now()
		v1alpha1.SetMachineResult(o, v1alpha1.MachineOperationTarget{Name: stranger, NodeName: stranger,
			Phase: v1alpha1.OperationSucceeded, StartTime: &now, CompletionTime: &now}, v1alpha1.CountAll)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	cur, err := admin.GetOperation(ctx, op.Name)
	if err != nil {
		t.Fatal(err)
	}
	err = s.DeleteFinishedOperation(ctx, op.Name, cur.UID, cur.ResourceVersion)
	rig.WantRejected(t, "the stranger deletes the finished operation of its Machine", err, apierrors.IsForbidden, rbac("delete", "machineoperations"))

	l := &v1alpha1.RolloutLease{Spec: v1alpha1.RolloutLeaseSpec{HolderIdentity: stranger, LeaseDurationSeconds: 10}}
	l.Name, l.Labels = rollout.Name("ne-restart", 0), map[string]string{v1alpha1.LabelOperation: "ne-restart"}
	_, err = rollout.REST{Client: s.REST()}.Create(ctx, l)
	rig.WantRejected(t, "the stranger takes a rollout slot", err, apierrors.IsForbidden, rbac("create", "rolloutleases"))

	// The agent of a node that joins before it is enrolled: nothing registered until an administrator enrolls it.
	const joiner = "ne-joiner"
	root, rc, err := fleet.InstallUnenrolled(cp, t.TempDir(), joiner, "test")
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := watcher.Run(wctx, watcher.Options{Root: root, REST: rc, NodeName: joiner, MachineName: joiner,
			AgentVersion: "test", Log: rig.APILog(t).With("agent", joiner)}); err != nil && wctx.Err() == nil {
			t.Errorf("agent %s: %v", joiner, err)
		}
	}()
	t.Cleanup(func() {
		wcancel()
		<-done
		_ = admin.DeleteMachine(context.Background(), joiner)
		_, _ = clusterinstall.Enroll(context.Background(), cp.AdminConfig(), []string{joiner}, false, slog.New(slog.DiscardHandler))
	})
	time.Sleep(3 * time.Second) // the agent's first attempts, refused
	if _, err := admin.GetMachine(ctx, joiner); !apierrors.IsNotFound(err) {
		t.Fatalf("Machine %s before its node was enrolled: err %v, want NotFound", joiner, err)
	}
	lines, err := clusterinstall.Enroll(ctx, cp.AdminConfig(), []string{joiner}, true, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "no Machine "+joiner+" yet") {
		t.Errorf("enroll of a node without a Machine said %q", lines)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got, err := admin.GetMachine(ctx, joiner)
		if err == nil {
			if got.Labels[v1alpha1.LabelEnrolled] != "true" || len(got.Labels) != 1 {
				t.Errorf("Machine %s registered with labels %v, want only %s=true", joiner, got.Labels, v1alpha1.LabelEnrolled)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Machine %s not registered within 2m of the enrollment: %v", joiner, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
