package rollout

// Paced rollouts against the rig's real apiserver: in-process agents (lib/watcher.Run on
// host roots laid down by fleet.Install, each with its own node identity) on one selector operation with
// spec.rollout. The repaver does not run in-process: each agent has a fake request runner that takes the request
// file its watcher writes, reports InProgress, holds it for a while and writes the final status, as a worker does
// (no claim and no lock: nothing else reads the request). What runs at once is sampled continuously from the
// runners themselves; the operation's status and the RolloutLeases are read as an admin.

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/transport"

	"github.com/kubeslot/kubeslot/integration/fleet"
	"github.com/kubeslot/kubeslot/integration/kube"
	"github.com/kubeslot/kubeslot/integration/machineapi"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/rollout"
	"github.com/kubeslot/kubeslot/lib/watcher"
)

// Timings of the harness: short leases so a dead agent's slot frees itself within the test.
const (
	roLease = 3 * time.Second
	roPoll  = 300 * time.Millisecond
)

// roAgent is one in-process agent and its fake runner.
type roAgent struct {
	name   string
	root   *hostroot.Root
	cancel context.CancelFunc
	done   chan struct{}
	// fail makes its runner report Failed; hold blocks it until closed (nil: roHold).
	fail    atomic.Bool
	hold    chan struct{}
	ran     atomic.Int32 // requests its runner started
	running atomic.Bool
	// slotCalls counts the requests its watcher sent for RolloutLeases.
	slotCalls atomic.Int64
	// started and ended are when its runner's last request started and finished.
	mu             sync.Mutex
	started, ended time.Time
}

// countSlotCalls counts the RolloutLease requests that pass through it.
type countSlotCalls struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (c countSlotCalls) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.Contains(r.URL.Path, "/"+v1alpha1.RolloutLeasesResource) {
		c.n.Add(1)
	}
	return c.rt.RoundTrip(r)
}

func (c countSlotCalls) WrappedRoundTripper() http.RoundTripper { return c.rt }

type roHarness struct {
	t      *testing.T
	cp     *kube.ControlPlane
	admin  *machineapi.Client
	agents []*roAgent
	cfgs   map[string]*agentCfg
	// now and peak count the runners between InProgress and their final status.
	now, peak atomic.Int32
	stop      context.CancelFunc
	wg        sync.WaitGroup
	bin       string // the kubeslot CLI, once built
}

type agentCfg struct{ opts watcher.Options }

const roHold = 1200 * time.Millisecond

// newRolloutFleet starts n agents named <prefix>-<i>, waits for their Machines and, as the cluster admin, enrolls
// each (kubeslot.dev/enrolled=true) and labels it rollout=prefix and order=<i>.
func newRolloutFleet(t *testing.T, prefix string, n int) *roHarness {
	cp := rig.NeedAPI(t)
	h := &roHarness{t: t, cp: cp, admin: rig.AdminAPI(t, cp), cfgs: map[string]*agentCfg{}}
	dir := t.TempDir() // before the cleanup below, so that it is removed after the agents stopped
	ctx, cancel := context.WithCancel(context.Background())
	h.stop = cancel
	t.Cleanup(func() {
		for _, a := range h.agents {
			if a.cancel != nil {
				a.cancel()
				<-a.done
			}
		}
		cancel()
		h.wg.Wait()
		for _, a := range h.agents {
			_ = h.admin.DeleteMachine(context.Background(), a.name)
		}
	})
	for i := range n {
		name := fmt.Sprintf("%s-%d", prefix, i)
		root, rc, err := fleet.Install(cp, filepath.Join(dir, name), name, "test")
		if err != nil {
			t.Fatal(err)
		}
		a := &roAgent{name: name, root: root}
		rc.WrapTransport = transport.Wrappers(rc.WrapTransport, func(rt http.RoundTripper) http.RoundTripper {
			return countSlotCalls{rt, &a.slotCalls}
		})
		h.agents = append(h.agents, a)
		h.cfgs[name] = &agentCfg{opts: watcher.Options{Root: root, REST: rc, NodeName: name, MachineName: name,
			AgentVersion: "test", Log: rig.APILog(t).With("agent", name), RolloutLease: roLease, RolloutPoll: roPoll}}
		h.startAgent(a)
		h.wg.Add(1)
		go func() { defer h.wg.Done(); h.runner(ctx, a) }()
	}
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer wcancel()
	for i, a := range h.agents {
		for {
			m, err := h.admin.GetMachine(wctx, a.name)
			if err == nil {
				if m.Labels == nil {
					m.Labels = map[string]string{}
				}
				m.Labels["rollout"], m.Labels["order"] = prefix, fmt.Sprint(i)
				if _, err = h.admin.UpdateMachine(wctx, m); err == nil {
					break
				}
			}
			if wctx.Err() != nil {
				t.Fatalf("Machine %s not registered and labelled: %v", a.name, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	var names []string
	for _, a := range h.agents {
		names = append(names, a.name)
	}
	rig.Enroll(t, wctx, cp, names...)
	return h
}

// startAgent runs a's watcher until a.cancel.
func (h *roHarness) startAgent(a *roAgent) {
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel, a.done = cancel, make(chan struct{})
	// Read here, in the test's goroutine: newRolloutFleet adds the next agents' entries to h.cfgs meanwhile.
	opts := h.cfgs[a.name].opts
	go func() {
		defer close(a.done)
		if err := watcher.Run(ctx, opts); err != nil && ctx.Err() == nil {
			h.t.Errorf("agent %s: %v", a.name, err)
		}
	}()
}

// killAgent stops a's watcher and its runner's current request (the host is gone).
func (h *roHarness) killAgent(a *roAgent) {
	a.cancel()
	<-a.done
	if a.running.CompareAndSwap(true, false) {
		h.now.Add(-1)
	}
}

// runner is a's fake worker: each repave request its watcher writes is reported InProgress, held, then finished.
func (h *roHarness) runner(ctx context.Context, a *roAgent) {
	dir := requests.New(a.root)
	seen := map[string]bool{}
	for ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
		r, err := dir.Pending(requests.Repave)
		if err != nil || r == nil || seen[r.ID] {
			continue
		}
		seen[r.ID] = true
		a.mu.Lock()
		a.started = time.Now()
		a.mu.Unlock()
		a.ran.Add(1)
		a.running.Store(true)
		if c := h.now.Add(1); c > h.peak.Load() {
			h.peak.Store(c)
		}
		start := time.Now().UTC()
		st := &requests.Status{RequestID: r.ID, Kind: r.Kind, Operation: r.Operation, MachineGeneration: r.MachineGeneration,
			Phase: requests.InProgress, Message: "fake repave", Phases: []requests.PhaseTiming{{Name: "fake", StartedAt: start}}}
		if err := dir.WriteStatus(st); err != nil {
			h.t.Errorf("%s: %v", a.name, err)
		}
		hold := a.hold
		if hold == nil {
			c := make(chan struct{})
			time.AfterFunc(roHold, func() { close(c) })
			hold = c
		}
		select {
		case <-hold:
		case <-ctx.Done():
			return
		}
		if !a.running.CompareAndSwap(true, false) {
			continue // killed meanwhile: a dead host reports nothing
		}
		h.now.Add(-1)
		a.mu.Lock()
		a.ended = time.Now()
		a.mu.Unlock()
		st.Phases = []requests.PhaseTiming{{Name: "fake", StartedAt: start, Duration: time.Since(start)}}
		st.Phase, st.Message = requests.Succeeded, "fake repave done"
		if a.fail.Load() {
			st.Phase, st.Message = requests.Failed, "fake repave failed: broken kubelet"
		}
		// The fake's point of no return is the end of its hold, where the real worker checks its slot too.
		if err := dir.CheckSlot(r.ID); err != nil {
			st.Phase, st.Message = requests.Failed, "fake repave stopped before the switch: "+err.Error()
		}
		if err := dir.WriteStatus(st); err != nil {
			h.t.Errorf("%s: %v", a.name, err)
		}
		if p, err := dir.RequestPath(requests.Repave); err == nil {
			_ = os.Remove(p)
		}
	}
}

// pacedOperation is a Repave of the harness's Machines with rollout r.
func (h *roHarness) pacedOperation(name, prefix string, r v1alpha1.Rollout) *v1alpha1.MachineOperation {
	op := &v1alpha1.MachineOperation{Spec: v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationRepave,
		MachineSelector: &v1alpha1.MachineSelector{MatchLabels: map[string]string{"rollout": prefix}}, Rollout: &r}}
	op.Name = name
	out, err := h.admin.CreateOperation(context.Background(), op)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = h.admin.DeleteOperation(context.Background(), name) })
	return out
}

// waitOp polls the operation until ok says so, bounded by d.
func (h *roHarness) waitOp(name string, d time.Duration, what string, ok func(*v1alpha1.MachineOperation) bool) *v1alpha1.MachineOperation {
	h.t.Helper()
	deadline := time.Now().Add(d)
	var last *v1alpha1.MachineOperation
	for time.Now().Before(deadline) {
		op, err := h.admin.GetOperation(context.Background(), name)
		if err == nil {
			last = op
			if ok(op) {
				return op
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	h.t.Fatalf("operation %s: %s not reached in %v; last status: %s", name, what, d, rig.DescribeOp(last))
	return nil
}

func (h *roHarness) leases(op string) []v1alpha1.RolloutLease {
	ls, err := rollout.REST{Client: h.admin.REST()}.List(context.Background(), op)
	if err != nil {
		h.t.Fatal(err)
	}
	return ls
}

// TestRolloutOneAtATime: four agents, maxUnavailable 1: never two running at once, all finish, the slots are given
// back, and the counts are in the status.
func TestRolloutOneAtATime(t *testing.T) {
	h := newRolloutFleet(t, "ro1", 4)
	watched := h.watchStatus("ro1-repave")
	t0 := time.Now()
	h.pacedOperation("ro1-repave", "ro1", v1alpha1.Rollout{MaxUnavailable: &intstr.IntOrString{IntVal: 1}})
	op := h.waitOp("ro1-repave", 3*time.Minute, "Succeeded", func(op *v1alpha1.MachineOperation) bool {
		return op.Status.Phase == v1alpha1.OperationSucceeded && len(op.Status.Machines) == 4
	})
	took := time.Since(t0)
	if p := h.peak.Load(); p != 1 {
		t.Errorf("%d requests ran at once, want at most 1 (maxUnavailable 1)", p)
	}
	for _, a := range h.agents {
		if n := a.ran.Load(); n != 1 {
			t.Errorf("%s ran %d requests, want 1", a.name, n)
		}
	}
	if op.Status.Done != 4 || op.Status.Failed != 0 || op.Status.Waiting != 0 || op.Status.InProgress != 0 {
		t.Errorf("counts: %s", rig.DescribeOp(op))
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(h.leases("ro1-repave")) > 0 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	if ls := h.leases("ro1-repave"); len(ls) > 0 {
		t.Errorf("slots not given back: %v", rollout.Names(ls))
	}
	rig.Figures.Add("rollout of 4 in-process agents, maxUnavailable 1, 1.2 s fake repaves", took)
	h.checkWatchable("ro1-repave", op, v1alpha1.OpConditionComplete, 0, "Outcome: Succeeded: 4 of 4", watched)
}

// TestRolloutFailureBudgetHalts: ordered by label, the second agent fails with failure budget 1: the rollout halts
// naming it and the rest never start, then raising the budget resumes it.
func TestRolloutFailureBudgetHalts(t *testing.T) {
	h := newRolloutFleet(t, "ro2", 4)
	h.agents[1].fail.Store(true)
	one := int32(1)
	h.pacedOperation("ro2-repave", "ro2", v1alpha1.Rollout{FailureBudget: &one, OrderByLabel: "order"})
	op := h.waitOp("ro2-repave", 2*time.Minute, "Halted", func(op *v1alpha1.MachineOperation) bool {
		return op.Status.Phase == v1alpha1.OperationHalted
	})
	if !strings.Contains(op.Status.Message, "ro2-1") || op.Status.Failed != 1 || op.Status.Done != 1 {
		t.Errorf("halted status does not name ro2-1 with 1 done, 1 failed: %s", rig.DescribeOp(op))
	}
	h.checkWatchable("ro2-repave", op, v1alpha1.OpConditionHalted, 1, "Outcome: Halted: 1 of 4", nil)
	// Long enough for a slot to be taken twice over: nobody starts.
	time.Sleep(roLease + 5*roPoll)
	for _, a := range h.agents[2:] {
		if n := a.ran.Load(); n != 0 {
			t.Errorf("%s ran %d requests after the rollout halted", a.name, n)
		}
	}
	op = h.waitOp("ro2-repave", 10*time.Second, "still Halted with 2 waiting", func(op *v1alpha1.MachineOperation) bool {
		return op.Status.Phase == v1alpha1.OperationHalted && op.Status.Waiting == 2
	})
	if h.peak.Load() > 1 {
		t.Errorf("%d requests ran at once, want 1", h.peak.Load())
	}
	// Resume: a person raises the budget (the one spec field, with paused, that may change).
	op.Spec.Rollout.FailureBudget = ptrInt32(2)
	if _, err := h.admin.UpdateOperation(context.Background(), op); err != nil {
		t.Fatalf("raise spec.rollout.failureBudget: %v", err)
	}
	op = h.waitOp("ro2-repave", 2*time.Minute, "Failed (finished, one failure)", func(op *v1alpha1.MachineOperation) bool {
		return op.Status.Phase == v1alpha1.OperationFailed
	})
	if op.Status.Done != 3 || op.Status.Failed != 1 {
		t.Errorf("after resuming: %s", rig.DescribeOp(op))
	}
}

func ptrInt32(v int32) *int32 { return &v }

// TestRolloutDeadHolderSlotExpires: the agent holding the slot is restarted (it finds its slot on the server and
// keeps it), then killed for good: its lease is not renewed, expires, and the rest of the rollout goes on.
func TestRolloutDeadHolderSlotExpires(t *testing.T) {
	h := newRolloutFleet(t, "ro3", 3)
	for _, a := range h.agents {
		a.hold = make(chan struct{}) // nobody finishes until told
	}
	h.pacedOperation("ro3-repave", "ro3", v1alpha1.Rollout{})
	var holder *roAgent
	deadline := time.Now().Add(time.Minute)
	for holder == nil && time.Now().Before(deadline) {
		for _, a := range h.agents {
			if a.running.Load() {
				holder = a
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if holder == nil {
		t.Fatal("no agent started in a minute")
	}
	ls := h.leases("ro3-repave")
	if len(ls) != 1 || ls[0].Spec.HolderIdentity != holder.name {
		t.Fatalf("leases %v, want one held by %s", rollout.Names(ls), holder.name)
	}
	// What the waiting agents ask for a slot: one List per poll, whatever the fleet's size.
	waitCalls := func() (n int64) {
		for _, a := range h.agents {
			if a != holder {
				n += a.slotCalls.Load()
			}
		}
		return n
	}
	calls0, t0 := waitCalls(), time.Now()
	// A restart of the holder's watcher: it keeps its slot (renewed past the lease duration), nobody else starts.
	holder.cancel()
	<-holder.done
	h.startAgent(holder)
	time.Sleep(2 * roLease)
	perMin := float64(waitCalls()-calls0) / float64(len(h.agents)-1) / time.Since(t0).Minutes()
	rig.Figures.AddValue(fmt.Sprintf("rollout: slot requests per waiting agent (poll %v; 10 s in production: 6/min)", roPoll), perMin, rig.UnitPerMinute)
	ls = h.leases("ro3-repave")
	if len(ls) != 1 || ls[0].Spec.HolderIdentity != holder.name || ls[0].Spec.LeaseTransitions != 0 {
		t.Fatalf("after the holder's restart: leases %v (transitions %d), want still %s's", rollout.Names(ls), ls[0].Spec.LeaseTransitions, holder.name)
	}
	if h.peak.Load() != 1 {
		t.Fatalf("%d ran at once after the holder's restart", h.peak.Load())
	}
	// Killed: the host is gone.
	killed := time.Now()
	h.killAgent(holder)
	last := h.leases("ro3-repave")[0].Spec.RenewTime.Time // the dead holder's last renewal
	var next *roAgent
	deadline = time.Now().Add(time.Minute)
	for next == nil && time.Now().Before(deadline) {
		for _, a := range h.agents {
			if a != holder && a.running.Load() {
				next = a
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if next == nil {
		t.Fatalf("nobody took the dead holder's slot in a minute; leases %v", rollout.Names(h.leases("ro3-repave")))
	}
	took := time.Since(killed)
	ls = h.leases("ro3-repave")
	if len(ls) != 1 || ls[0].Spec.HolderIdentity != next.name || ls[0].Spec.LeaseTransitions != 1 {
		t.Fatalf("leases %v, want one taken over by %s", rollout.Names(ls), next.name)
	}
	// One clock (one process): the takeover comes a lease duration or more after the last renewal, never sooner.
	if gap := ls[0].Spec.AcquireTime.Sub(last); gap < roLease {
		t.Errorf("%s took the slot %v after the dead holder's last renewal, before its lease of %v expired", next.name, gap, roLease)
	} else {
		t.Logf("slot taken over %v after the last renewal, %v after the kill", gap.Round(time.Millisecond), took.Round(time.Millisecond))
	}
	rig.Figures.Add("rollout: dead holder's slot taken over (lease 3 s)", took)
	// The rest finishes (the dead host's entry stays InProgress: nobody reports for it).
	for _, a := range h.agents {
		if a != holder {
			close(a.hold)
		}
	}
	h.waitOp("ro3-repave", time.Minute, "2 done", func(op *v1alpha1.MachineOperation) bool { return op.Status.Done == 2 })
	if h.peak.Load() != 1 {
		t.Errorf("%d requests ran at once, want 1", h.peak.Load())
	}
}

// TestRolloutAPI: the CRD refuses bad rollout settings naming the field, lets only paused and failureBudget change,
// and the admission policy keeps each agent to slots in its own name.
func TestRolloutAPI(t *testing.T) {
	cp := rig.NeedAPI(t)
	ctx := rig.APICtx(t)
	admin := rig.AdminAPI(t, cp)
	mk := func(name string, r v1alpha1.Rollout) *v1alpha1.MachineOperation {
		op := &v1alpha1.MachineOperation{Spec: v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationRepave,
			MachineSelector: &v1alpha1.MachineSelector{MatchLabels: map[string]string{"pool": "roapi"}}, Rollout: &r}}
		op.Name = name
		return op
	}
	intOr := func(v intstr.IntOrString) *intstr.IntOrString { return &v }
	bad := []struct {
		name string
		r    v1alpha1.Rollout
		want []string
	}{
		{"maxUnavailable 0", v1alpha1.Rollout{MaxUnavailable: intOr(intstr.FromInt32(0))}, []string{"spec.rollout.maxUnavailable", "at least 1"}},
		{"maxUnavailable 0%", v1alpha1.Rollout{MaxUnavailable: intOr(intstr.FromString("0%"))}, []string{"spec.rollout.maxUnavailable", "1% to 100%"}},
		{"maxUnavailable 101%", v1alpha1.Rollout{MaxUnavailable: intOr(intstr.FromString("101%"))}, []string{"spec.rollout.maxUnavailable", "1% to 100%"}},
		{"maxUnavailable words", v1alpha1.Rollout{MaxUnavailable: intOr(intstr.FromString("half"))}, []string{"spec.rollout.maxUnavailable"}},
		{"failureBudget -1", v1alpha1.Rollout{FailureBudget: ptrInt32(-1)}, []string{"spec.rollout.failureBudget", "greater than or equal to 0"}},
		{"soakSeconds a day and more", v1alpha1.Rollout{SoakSeconds: 86401}, []string{"spec.rollout.soakSeconds", "less than or equal to 86400"}},
		{"window start 25:00", v1alpha1.Rollout{Windows: []v1alpha1.MaintenanceWindow{{Start: "25:00", Duration: "1h"}}},
			[]string{"spec.rollout.windows[0].start", "25:00"}},
		{"window duration in words", v1alpha1.Rollout{Windows: []v1alpha1.MaintenanceWindow{{Start: "02:00", Duration: "4 hours"}}},
			[]string{"spec.rollout.windows[0].duration", "from 1m to 168h"}},
		{"window of 8 days", v1alpha1.Rollout{Windows: []v1alpha1.MaintenanceWindow{{Start: "02:00", Duration: "192h"}}},
			[]string{"spec.rollout.windows[0].duration", "from 1m to 168h"}},
		{"window day Monday", v1alpha1.Rollout{Windows: []v1alpha1.MaintenanceWindow{{Days: []v1alpha1.Weekday{"Monday"}, Start: "02:00", Duration: "1h"}}},
			[]string{"spec.rollout.windows[0].days[0]", "Monday"}},
	}
	for _, tc := range bad {
		_, err := admin.CreateOperation(ctx, mk("roapi-bad", tc.r))
		rig.WantRejected(t, "rollout: "+tc.name, err, apierrors.IsInvalid, tc.want...)
	}
	ref := mk("roapi-ref", v1alpha1.Rollout{})
	ref.Spec.MachineSelector, ref.Spec.MachineRef = nil, &v1alpha1.MachineReference{Name: "x"}
	_, err := admin.CreateOperation(ctx, ref)
	rig.WantRejected(t, "rollout on a machineRef operation", err, apierrors.IsInvalid, "spec.rollout is only for an operation with spec.machineSelector")

	op, err := admin.CreateOperation(ctx, mk("roapi-ok", v1alpha1.Rollout{MaxUnavailable: intOr(intstr.FromString("50%")), OrderByLabel: "zone"}))
	if err != nil {
		t.Fatalf("a valid rollout refused: %v", err)
	}
	t.Cleanup(func() { _ = admin.DeleteOperation(context.Background(), "roapi-ok") })
	op.Spec.Rollout.Paused, op.Spec.Rollout.FailureBudget = true, ptrInt32(3)
	if op, err = admin.UpdateOperation(ctx, op); err != nil {
		t.Fatalf("pause and raise the budget: %v", err)
	}
	for _, m := range []struct {
		name   string
		mutate func(*v1alpha1.MachineOperation)
		want   string
	}{
		{"maxUnavailable", func(o *v1alpha1.MachineOperation) { o.Spec.Rollout.MaxUnavailable = intOr(intstr.FromInt32(2)) }, "spec.rollout.maxUnavailable"},
		{"orderByLabel", func(o *v1alpha1.MachineOperation) { o.Spec.Rollout.OrderByLabel = "rack" }, "spec.rollout.orderByLabel"},
		{"soakSeconds", func(o *v1alpha1.MachineOperation) { o.Spec.Rollout.SoakSeconds = 30 }, "spec.rollout.soakSeconds"},
		{"type", func(o *v1alpha1.MachineOperation) { o.Spec.Type = v1alpha1.OperationNodeRestart }, "spec.type is immutable"},
		{"selector", func(o *v1alpha1.MachineOperation) { o.Spec.MachineSelector.MatchLabels["pool"] = "other" }, "spec.machineSelector is immutable"},
		{"rollout removed", func(o *v1alpha1.MachineOperation) { o.Spec.Rollout = nil }, "spec is immutable once created"},
		{"ttl added", func(o *v1alpha1.MachineOperation) { o.Spec.TTLSecondsAfterFinished = ptrInt32(5) }, "spec is immutable once created"},
	} {
		o := op.DeepCopy()
		m.mutate(o)
		_, err := admin.UpdateOperation(ctx, o)
		rig.WantRejected(t, "change of "+m.name, err, apierrors.IsInvalid, m.want)
	}

	// Slots: only an enrolled node takes one, and only in its own name.
	a := rollout.REST{Client: rig.OutsiderAPI(t, cp, "roapi-a").REST()}
	b := rollout.REST{Client: rig.OutsiderAPI(t, cp, "roapi-b").REST()}
	lease := func(name, holder string) *v1alpha1.RolloutLease {
		l := &v1alpha1.RolloutLease{Spec: v1alpha1.RolloutLeaseSpec{HolderIdentity: holder, LeaseDurationSeconds: 10}}
		l.Name, l.Labels = name, map[string]string{v1alpha1.LabelOperation: "roapi-ok"}
		return l
	}
	_, err = a.Create(ctx, lease("roapi-ok-0", "roapi-a"))
	rig.WantRejected(t, "node roapi-a, not enrolled, takes a slot in its own name", err, apierrors.IsForbidden,
		`cannot create resource "rolloutleases"`)
	for _, n := range []string{"roapi-a", "roapi-b"} {
		m := rig.SampleMachine(n, n)
		m.Labels = nil
		if _, err := admin.CreateMachine(ctx, m); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.DeleteMachine(context.Background(), n) })
	}
	rig.Enroll(t, ctx, cp, "roapi-a", "roapi-b")
	// The binding and the policy are new: wait until both are in force (the apiserver loads them a little later).
	deadline := time.Now().Add(time.Minute)
	for {
		_, err = a.Create(ctx, lease("roapi-ok-0", "roapi-b"))
		rbacPending := apierrors.IsForbidden(err) && strings.Contains(err.Error(), "cannot create resource")
		if (err != nil && !rbacPending) || time.Now().After(deadline) {
			break
		}
		if err == nil {
			adminDeleteLease(admin, "roapi-ok-0")
		}
		time.Sleep(200 * time.Millisecond)
	}
	rig.WantRejected(t, "agent A takes a slot in B's name", err, apierrors.IsForbidden, `spec.holderIdentity must be "roapi-a"`)
	mine, err := a.Create(ctx, lease("roapi-ok-0", "roapi-a"))
	if err != nil {
		t.Fatalf("agent A takes a slot in its own name: %v", err)
	}
	t.Cleanup(func() { adminDeleteLease(admin, "roapi-ok-0") })
	renew := mine.DeepCopy()
	renew.Spec.LeaseDurationSeconds = 20
	_, err = b.Update(ctx, renew)
	rig.WantRejected(t, "agent B writes A's slot in A's name", err, apierrors.IsForbidden, `spec.holderIdentity must be "roapi-b"`)
	err = b.Delete(ctx, "roapi-ok-0", mine.ResourceVersion)
	rig.WantRejected(t, "agent B deletes A's slot", err, apierrors.IsForbidden, `held by "roapi-a"`)
	if err := a.Delete(ctx, "roapi-ok-0", mine.ResourceVersion); err != nil {
		t.Errorf("agent A gives its slot back: %v", err)
	}
}

func adminDeleteLease(admin *machineapi.Client, name string) {
	_ = admin.REST().Delete().Resource(v1alpha1.RolloutLeasesResource).Name(name).Do(context.Background()).Error()
}
