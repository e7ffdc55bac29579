package repave

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubeslot/kubeslot/lib/artifact"
	"github.com/kubeslot/kubeslot/lib/cri"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/requests"
)

func lock(t *testing.T, r *rig) *ownership.Lock {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := ownership.Acquire(ctx, r.root, ownership.Holder{Stage: "test"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Release() })
	return l
}

func execute(t *testing.T, r *rig, j Job) (*requests.Status, error) {
	t.Helper()
	l := lock(t, r)
	defer l.Release()
	return Execute(context.Background(), r.d, l, j)
}

// TestRepaveOrder: a request is claimed and run through the phases in
// order, the state file naming each phase before it runs; the target is
// committed, the boot link moved, the old slot removed, the claim finished.
func TestRepaveOrder(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	req := r.request(t, 3)
	var seen []Phase
	r.d.Pause = func(ctx context.Context, name string) error {
		p := Phase(name)
		st, err := LoadState(r.root)
		if err != nil || st == nil || st.Phase != p {
			t.Errorf("before phase %s the state file holds %+v (err %v)", p, st, err)
		}
		if p != Commit && p != Uncordon && p != Clean {
			if a := r.active(t); a.Slot != "a" {
				t.Errorf("before commit (phase %s) the active slot is %s", p, a.Slot)
			}
		}
		seen = append(seen, p)
		return nil
	}
	s, err := execute(t, r, Job{Kind: requests.Repave, Slot: NextSlot})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(seen, Phases()) {
		t.Errorf("phases %v, want %v", seen, Phases())
	}
	want := "provision:b configure:b warm:b cordon:node1 evict:web stop:a stop:a start:b boot:b uncordon:node1 remove:a"
	if got := r.h.callList(); got != want {
		t.Errorf("calls %q, want %q", got, want)
	}
	if s.Phase != requests.Succeeded || s.ActiveSlot != "b" || s.RequestID != req.ID || s.Downtime <= 0 || len(s.Phases) != len(Phases()) {
		t.Errorf("status %+v", s)
	}
	if got, err := r.d.Requests.ReadStatus(req.ID); err != nil || got.Phase != requests.Succeeded {
		t.Errorf("status file: %+v, %v", got, err)
	}
	if a := r.active(t); a.Slot != "b" || a.Config.Kubernetes.Labels["tier"] != "new" {
		t.Errorf("active applied %s with labels %v", a.Slot, a.Config.Kubernetes.Labels)
	}
	if _, err := r.d.Store.LoadApplied("a"); err == nil {
		t.Error("the old slot's applied configuration is still there")
	}
	if st, _ := LoadState(r.root); st != nil {
		t.Errorf("state left: %+v", st)
	}
	if c, _ := r.d.Requests.Claimed(requests.Repave); c != nil {
		t.Error("the claimed request was not finished")
	}
}

var errCrash = errors.New("simulated crash")

// crashAt is a pause hook that ends the run as a crash (errCrash) before
// phase p.
func crashAt(p Phase) func(context.Context, string) error {
	return func(_ context.Context, name string) error {
		if Phase(name) == p {
			return errCrash
		}
		return nil
	}
}

// TestResumeFromEveryPhase: a run that dies at the start of each phase (the
// state written) is resumed by the next run, which completes the repave.
func TestResumeFromEveryPhase(t *testing.T) {
	t.Parallel()
	for _, p := range Phases() {
		t.Run(string(p), func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			req := r.request(t, 5)
			r.d.Pause = crashAt(p)
			if _, err := execute(t, r, Job{Kind: requests.Repave, Slot: NextSlot}); !errors.Is(err, errCrash) {
				t.Fatalf("first run: %v, want the crash", err)
			}
			st, err := LoadState(r.root)
			if err != nil || st == nil || st.Phase != p {
				t.Fatalf("after the crash the state is %+v (err %v), want phase %s", st, err, p)
			}
			if p != Commit && p != Uncordon && p != Clean {
				if a := r.active(t); a.Slot != "a" {
					t.Errorf("crash before commit: active slot %s", a.Slot)
				}
			}
			r.d.Pause = nil
			// A manual start (another kind of job, another slot) resumes
			// the interrupted transition first.
			s, err := execute(t, r, Job{Kind: requests.Repave, Slot: "b"})
			if err != nil {
				t.Fatalf("resume: %v", err)
			}
			if s.RequestID != req.ID || s.Phase != requests.Succeeded {
				t.Errorf("resume status %+v", s)
			}
			if a := r.active(t); a.Slot != "b" {
				t.Errorf("active %s after the resume", a.Slot)
			}
			if r.h.running["a"] || !r.h.running["b"] || r.h.provisioned["a"] {
				t.Errorf("host after the resume: running %v provisioned %v", r.h.running, r.h.provisioned)
			}
			if c, _ := r.d.Requests.Claimed(requests.Repave); c != nil {
				t.Error("claimed request left")
			}
			// Cordoned once, uncordoned once, whatever the kill.
			if r.dr.cordoned() || r.h.count("cordon:node1") != 1 || r.h.count("uncordon:node1") != 1 {
				t.Errorf("cordoned %v after the resume; calls %s", r.dr.cordoned(), r.h.callList())
			}
		})
	}
}

func checkRolledBack(t *testing.T, r *rig, s *requests.Status, err error, reason string) {
	t.Helper()
	if !errors.Is(err, ErrRolledBack) {
		t.Fatalf("error %v, want a rollback", err)
	}
	if s.Phase != requests.Failed || s.ActiveSlot != "a" || !strings.Contains(s.Message, reason) || s.Downtime <= 0 {
		t.Errorf("status %+v, want Failed on a naming %q", s, reason)
	}
	if a := r.active(t); a.Slot != "a" || a.Config.Kubernetes.Labels["tier"] != "old" {
		t.Errorf("active %s %v after a rollback", a.Slot, a.Config.Kubernetes.Labels)
	}
	if _, lerr := r.d.Store.LoadApplied("b"); lerr == nil {
		t.Error("the failed target has an applied configuration")
	}
	if !r.h.running["a"] || r.h.running["b"] || len(r.h.moves) != 0 {
		t.Errorf("host: running %v, boot moves %v", r.h.running, r.h.moves)
	}
	if st, _ := LoadState(r.root); st != nil {
		t.Errorf("state left: %+v", st)
	}
}

// TestStandbyFailureKeepsTheOldNodeServing: a target whose machine does not
// boot warm is rolled back before the old node was ever stopped: no
// downtime, the target's machine stopped and the slot removed.
func TestStandbyFailureKeepsTheOldNodeServing(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.request(t, 2)
	r.h.fail["warm:b"] = errors.New("machine b did not boot")
	s, err := execute(t, r, Job{Kind: requests.Repave})
	if !errors.Is(err, ErrRolledBack) || s.Phase != requests.Failed || s.Downtime != 0 || !strings.Contains(s.Message, "did not boot") {
		t.Fatalf("status %+v, %v: want Failed without downtime", s, err)
	}
	if r.h.count("stop:a") != 0 || !r.h.running["a"] || r.h.booted["b"] || r.h.provisioned["b"] {
		t.Errorf("host: running %v, booted %v, provisioned %v; calls %s", r.h.running, r.h.booted, r.h.provisioned, r.h.callList())
	}
}

func TestRollbackOnStartFailure(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.request(t, 2)
	r.h.fail["start:b"] = errors.New("machine b did not boot")
	s, err := execute(t, r, Job{Kind: requests.Repave})
	checkRolledBack(t, r, s, err, "machine b did not boot")
	// The failed phase is timed too, then the rollback's.
	var names []string
	for _, p := range s.Phases {
		names = append(names, p.Name)
	}
	if want := []string{"prepare", "standby", "drain", "switch", "start", "rollback", "rollback-verify"}; !slices.Equal(names, want) {
		t.Errorf("status phases %q, want %q", names, want)
	}
}

func TestRollbackOnVerifyTimeout(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	req := r.request(t, 2)
	req.Desired.Timeouts.NodeReady.Duration = 300 * time.Millisecond
	if _, err := r.d.Requests.Write(&requests.Request{Kind: req.Kind, ID: requests.NewID(requests.Repave, 9, ""),
		MachineGeneration: 9, Desired: req.Desired, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	r.h.broken["b"] = true
	s, err := execute(t, r, Job{Kind: requests.Repave})
	checkRolledBack(t, r, s, err, "not Ready within 300ms")
	if !strings.Contains(s.Message, "verify") {
		t.Errorf("message %q does not name the phase", s.Message)
	}
}

// TestPrepareFailureKeepsOldNode: a bad rootfs fails in prepare; the old
// node was never stopped and nothing is committed.
func TestPrepareFailureKeepsOldNode(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.request(t, 2)
	r.h.fail["provision:b"] = errors.New("rootfs sha256 mismatch")
	s, err := execute(t, r, Job{Kind: requests.Repave})
	if err == nil || errors.Is(err, ErrRolledBack) {
		t.Fatalf("error %v", err)
	}
	if s.Phase != requests.Failed || !strings.Contains(s.Message, "sha256 mismatch") || !strings.Contains(s.Message, "prepare") {
		t.Errorf("status %+v", s)
	}
	if r.h.count("stop:a") != 0 || !r.h.running["a"] {
		t.Errorf("the old node was touched: %s", r.h.callList())
	}
	if a := r.active(t); a.Slot != "a" {
		t.Errorf("active %s", a.Slot)
	}
	if st, _ := LoadState(r.root); st != nil {
		t.Errorf("state left: %+v", st)
	}
	if c, _ := r.d.Requests.Claimed(requests.Repave); c != nil {
		t.Error("a failed request stays claimed")
	}
}

// TestRollbackFailureKeepsState: when the old slot cannot come back either,
// the state stays so that a re-run retries the rollback, and nothing names b.
func TestRollbackFailureKeepsState(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.request(t, 2)
	r.h.fail["start:b"] = errors.New("b broken")
	r.h.fail["start:a"] = errors.New("a broken too")
	if _, err := execute(t, r, Job{Kind: requests.Repave}); err == nil {
		t.Fatal("no error")
	}
	st, err := LoadState(r.root)
	if err != nil || st == nil || st.Phase != Rollback || st.FailedIn != Start {
		t.Fatalf("state %+v, %v", st, err)
	}
	delete(r.h.fail, "start:a")
	s, err := execute(t, r, Job{Kind: requests.Repave})
	checkRolledBack(t, r, s, err, "b broken")
}

// TestTwoTriggersOneRepave: two workers started for one request (two path
// unit firings, or a watcher and a person) serialise on the lock; the
// request is claimed once, and the second finds nothing to do.
func TestTwoTriggersOneRepave(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.request(t, 4)
	var wg sync.WaitGroup
	results := make([]*requests.Status, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			l, err := ownership.Acquire(ctx, r.root, ownership.Holder{Stage: "test"}, nil)
			if err != nil {
				errs[i] = err
				return
			}
			defer l.Release()
			results[i], errs[i] = Execute(ctx, r.d, l, Job{Kind: requests.Repave, Slot: NextSlot, Triggered: true})
		}()
	}
	wg.Wait()
	done := 0
	for i := range 2 {
		if errs[i] != nil {
			t.Errorf("worker %d: %v", i, errs[i])
		}
		if results[i] != nil {
			done++
		}
	}
	if done != 1 || r.h.count("provision:b") != 1 || r.h.count("start:b") != 1 {
		t.Errorf("%d repaves ran; calls %s", done, r.h.callList())
	}
}

// TestManualRepaveRebuildsActive: by hand, without a request, the active
// applied configuration is rebuilt onto the named slot.
func TestManualRepaveRebuildsActive(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	s, err := execute(t, r, Job{Kind: requests.Repave, Slot: "b"})
	if err != nil || s.Phase != requests.Succeeded || !strings.HasPrefix(s.RequestID, "repave-0-manual-") {
		t.Fatalf("%+v, %v", s, err)
	}
	if a := r.active(t); a.Slot != "b" || a.Config.Kubernetes.Labels["tier"] != "old" {
		t.Errorf("active %s %v", a.Slot, a.Config.Kubernetes.Labels)
	}
	// The active slot is not a target.
	if _, err := execute(t, r, Job{Kind: requests.Repave, Slot: "b"}); err == nil {
		t.Error("a repave onto the active slot was accepted")
	}
	// A triggered run with nothing to claim does nothing.
	if s, err := execute(t, r, Job{Kind: requests.Repave, Triggered: true}); s != nil || err != nil {
		t.Errorf("triggered without a request: %+v, %v", s, err)
	}
}

// TestBadRequestFinished: a claimed request that fails validation is
// reported Failed and removed, so the path unit does not loop on it.
func TestBadRequestFinished(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	req := r.request(t, 2)
	req.Desired.Isolation.Slots = []string{"x", "y"}
	req.ID = requests.NewID(requests.Repave, 3, "")
	if _, err := r.d.Requests.Write(req); err != nil {
		t.Fatal(err)
	}
	s, err := execute(t, r, Job{Kind: requests.Repave})
	if err == nil || s == nil || s.Phase != requests.Failed || !strings.Contains(s.Message, "isolation.slots") {
		t.Fatalf("%+v, %v", s, err)
	}
	if c, _ := r.d.Requests.Claimed(requests.Repave); c != nil {
		t.Error("bad request still claimed")
	}
	if r.h.callList() != "" {
		t.Errorf("the host was touched: %s", r.h.callList())
	}
}

func TestRestartInPlace(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	req := &requests.Request{Kind: requests.Restart, ID: requests.NewID(requests.Restart, 7, "op1"), MachineGeneration: 7,
		Operation: "op1", CreatedAt: time.Now()}
	if _, err := r.d.Requests.Write(req); err != nil {
		t.Fatal(err)
	}
	s, err := execute(t, r, Job{Kind: requests.Restart})
	if err != nil || s.Phase != requests.Succeeded || s.RequestID != req.ID || s.ActiveSlot != "a" || s.Operation != "op1" {
		t.Fatalf("%+v, %v", s, err)
	}
	// Drained before the restart, uncordoned after it.
	if got := r.h.callList(); got != "cordon:node1 evict:web stop:a start:a uncordon:node1" {
		t.Errorf("calls %q", got)
	}
	if c, _ := r.d.Requests.Claimed(requests.Restart); c != nil {
		t.Error("claimed restart left")
	}
	r.h.fail["start:a"] = errors.New("no boot")
	s, err = execute(t, r, Job{Kind: requests.Restart})
	if err == nil || s.Phase != requests.Failed || !strings.Contains(s.Message, "no boot") {
		t.Errorf("failed restart: %+v, %v", s, err)
	}
}

// criRuntime is a node's CRI runtime as lib/cri sees it: its sandboxes,
// and the ones removed, per socket.
type criRuntime struct {
	mu      sync.Mutex
	items   []*runtimeapi.PodSandbox
	removed map[string][]string // socket -> sandbox IDs
}

func (c *criRuntime) dial(socket string) (cri.Runtime, io.Closer, error) {
	return &criConn{c, socket}, io.NopCloser(nil), nil
}

type criConn struct {
	*criRuntime
	socket string
}

func (c *criConn) ListPodSandbox(context.Context, *runtimeapi.ListPodSandboxRequest, ...grpc.CallOption) (*runtimeapi.ListPodSandboxResponse, error) {
	return &runtimeapi.ListPodSandboxResponse{Items: c.items}, nil
}

func (c *criConn) RemovePodSandbox(_ context.Context, in *runtimeapi.RemovePodSandboxRequest, _ ...grpc.CallOption) (*runtimeapi.RemovePodSandboxResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removed[c.socket] = append(c.removed[c.socket], in.GetPodSandboxId())
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

// TestDeadSandboxesRemovedBesideVerify: a repave and a restart ask the
// node's runtime to remove the dead sandboxes created before the new
// kubelet started, never a newer one, and only once that kubelet is healthy
// and its Node Ready (past its start-up and first status); a failure there
// is only logged (the third run's restart succeeds).
func TestDeadSandboxesRemovedBesideVerify(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.h.sickPolls = 2 // the new kubelet answers its third health poll
	notReady := runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	c := &criRuntime{removed: map[string][]string{}, items: []*runtimeapi.PodSandbox{
		{Id: "old", State: notReady, CreatedAt: time.Now().Add(-time.Hour).UnixNano()},
		{Id: "new", State: notReady, CreatedAt: time.Now().Add(time.Hour).UnixNano()}, // after any kubelet start here
	}}
	r.d.DialCRI = c.dial
	r.request(t, 3)
	s, err := execute(t, r, Job{Kind: requests.Repave, Slot: NextSlot})
	if err != nil || s.Phase != requests.Succeeded {
		t.Fatalf("repave: %+v, %v", s, err)
	}
	for i, fail := range []bool{false, true} {
		req := &requests.Request{Kind: requests.Restart, ID: requests.NewID(requests.Restart, int64(4+i), "op"), MachineGeneration: int64(4 + i),
			Operation: "op", CreatedAt: time.Now()}
		if _, err := r.d.Requests.Write(req); err != nil {
			t.Fatal(err)
		}
		if fail {
			r.h.fail["cri:b"] = errors.New("CRI socket gone")
		}
		if s, err := execute(t, r, Job{Kind: requests.Restart}); err != nil || s.Phase != requests.Succeeded {
			t.Fatalf("restart (CRI failing: %t): %+v, %v", fail, s, err)
		}
	}
	r.h.mu.Lock()
	if len(r.h.criEarly) > 0 {
		t.Errorf("the runtime of slots %v was asked to remove sandboxes before their kubelet was healthy", r.h.criEarly)
	}
	r.h.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if want := map[string][]string{"/fake/b.sock": {"old", "old"}}; !maps.EqualFunc(c.removed, want, slices.Equal) {
		t.Errorf("removed %v, want %v (the repave's target, then the restart's; the older sandbox only)", c.removed, want)
	}
}

// TestResumeAfterReboot: a power cut in switch, start or verify boots the
// old node again (it stays enabled at boot until commit) with the target
// down; the resume stops the old node before it starts the target, and
// verifies the target again.
func TestResumeAfterReboot(t *testing.T) {
	t.Parallel()
	for _, p := range []Phase{Standby, Switch, Start, Verify} {
		t.Run(string(p), func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			r.request(t, 5)
			r.d.Pause = crashAt(p)
			if _, err := execute(t, r, Job{Kind: requests.Repave}); !errors.Is(err, errCrash) {
				t.Fatalf("first run: %v", err)
			}
			r.h.running, r.h.booted = map[string]bool{"a": true}, map[string]bool{"a": true} // the host booted: only the enabled slot runs
			r.d.Pause = nil
			s, err := execute(t, r, Job{Kind: requests.Repave})
			if err != nil || s.Phase != requests.Succeeded {
				t.Fatalf("resume after the reboot: %+v, %v", s, err)
			}
			if r.h.running["a"] || !r.h.running["b"] {
				t.Errorf("running %v after the resume; calls %s", r.h.running, r.h.callList())
			}
		})
	}
}

// TestNodeLabelsFollowTheConfiguration: the kubelet applies --node-labels
// only when it registers the Node, so a commit sets the new configuration's
// labels on the existing Node and removes those kubeslot set before that the
// new one dropped; labels kubeslot never set stay. A label update that fails
// leaves the repave committed, with a warning in the status.
func TestNodeLabelsFollowTheConfiguration(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	repave := func(labels map[string]string, gen int64) *requests.Status {
		t.Helper()
		desired := testConfig(t, "x")
		desired.Kubernetes.Labels = labels
		req := &requests.Request{Kind: requests.Repave, ID: requests.NewID(requests.Repave, gen, ""), MachineGeneration: gen,
			Reason: "labels", Desired: desired, CreatedAt: time.Now()}
		if _, err := r.d.Requests.Write(req); err != nil {
			t.Fatal(err)
		}
		s, err := execute(t, r, Job{Kind: requests.Repave, Triggered: true})
		if err != nil || s.Phase != requests.Succeeded {
			t.Fatalf("repave: %+v, %v", s, err)
		}
		return s
	}
	repave(map[string]string{"tier": "new", "example.com/extra": "1"}, 2)
	if got, want := r.h.labels(), "example.com/extra=1,kubernetes.io/hostname=node1,tier=new"; got != want {
		t.Errorf("after the first repave: labels %s, want %s", got, want)
	}
	repave(map[string]string{"tier": "newer"}, 3)
	if got, want := r.h.labels(), "kubernetes.io/hostname=node1,tier=newer"; got != want {
		t.Errorf("after the second repave: labels %s, want %s (example.com/extra dropped by the configuration)", got, want)
	}
	r.h.labelErr = errors.New("apiserver away")
	s := repave(map[string]string{"tier": "last"}, 4)
	if !strings.Contains(s.Message, "labels were not updated") || !strings.Contains(s.Message, "apiserver away") {
		t.Errorf("a failed label update is not reported: %q", s.Message)
	}
	if a := r.active(t); a.Config.Kubernetes.Labels["tier"] != "last" {
		t.Errorf("the repave was not committed: active %s %v", a.Slot, a.Config.Kubernetes.Labels)
	}
	// A restart in place sets the applied configuration's labels again.
	r.h.labelErr = nil
	req := &requests.Request{Kind: requests.Restart, ID: requests.NewID(requests.Restart, 5, "op"), MachineGeneration: 5,
		Operation: "op", CreatedAt: time.Now()}
	if _, err := r.d.Requests.Write(req); err != nil {
		t.Fatal(err)
	}
	if s, err := execute(t, r, Job{Kind: requests.Restart}); err != nil || s.Phase != requests.Succeeded {
		t.Fatalf("restart: %+v, %v", s, err)
	}
	if got, want := r.h.labels(), "kubernetes.io/hostname=node1,tier=last"; got != want {
		t.Errorf("after the restart: labels %s, want %s", got, want)
	}
}

// TestSameRequestTwiceRunsOnce: a request written again with the same ID
// after it ran is claimed and finished without a second repave.
func TestSameRequestTwiceRunsOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	req := r.request(t, 6)
	s, err := execute(t, r, Job{Kind: requests.Repave, Triggered: true})
	if err != nil || s.Phase != requests.Succeeded {
		t.Fatalf("first run: %+v, %v", s, err)
	}
	calls := r.h.callList()
	if _, err := r.d.Requests.Write(req); err != nil {
		t.Fatal(err)
	}
	s2, err := execute(t, r, Job{Kind: requests.Repave, Triggered: true})
	if err != nil || s2 == nil || s2.Phase != requests.Succeeded || s2.RequestID != req.ID {
		t.Fatalf("second write: %+v, %v", s2, err)
	}
	if got := r.h.callList(); got != calls {
		t.Errorf("the same request ran again: calls %q, then %q", calls, got)
	}
	if a := r.active(t); a.Slot != "b" {
		t.Errorf("active %s after the second write, want b", a.Slot)
	}
	if p, _ := r.d.Requests.Pending(requests.Repave); p != nil {
		t.Error("the second write is still pending")
	}
	if c, _ := r.d.Requests.Claimed(requests.Repave); c != nil {
		t.Error("the second write is still claimed")
	}
}

// TestNodeReadyFloorIsTheRunningKubelet: every Node-Ready wait takes its
// floor from the kubelet that runs in the slot, never from a clock reading
// of the repaver: a resumed verify whose target kubelet started before the
// resume still waits for that kubelet's status (today's status is already
// posted; a floor of "now" would wait for the next one, minutes away), and
// rollback and restart wait for the restarted kubelet.
func TestNodeReadyFloorIsTheRunningKubelet(t *testing.T) {
	t.Parallel()
	lastFloor := func(r *rig) time.Time {
		r.h.mu.Lock()
		defer r.h.mu.Unlock()
		if len(r.h.waitedSince) == 0 {
			t.Fatal("no Node-Ready wait")
		}
		return r.h.waitedSince[len(r.h.waitedSince)-1]
	}
	t.Run("resumed verify", func(t *testing.T) {
		t.Parallel()
		r := newRig(t)
		r.request(t, 5)
		r.d.Pause = crashAt(Verify)
		if _, err := execute(t, r, Job{Kind: requests.Repave}); !errors.Is(err, errCrash) {
			t.Fatalf("first run: %v", err)
		}
		startedB := r.h.started["b"]
		time.Sleep(20 * time.Millisecond)
		r.d.Pause = nil
		if s, err := execute(t, r, Job{Kind: requests.Repave}); err != nil || s.Phase != requests.Succeeded {
			t.Fatalf("resume: %+v, %v", s, err)
		}
		if got := lastFloor(r); startedB.IsZero() || !got.Equal(startedB) {
			t.Errorf("resumed verify waited for a status since %v, want the target kubelet's start %v", got, startedB)
		}
	})
	t.Run("rollback", func(t *testing.T) {
		t.Parallel()
		r := newRig(t)
		r.request(t, 2)
		r.h.fail["start:b"] = errors.New("machine b did not boot")
		before := time.Now()
		if _, err := execute(t, r, Job{Kind: requests.Repave}); !errors.Is(err, ErrRolledBack) {
			t.Fatalf("repave: %v", err)
		}
		if got := lastFloor(r); !got.Equal(r.h.started["a"]) || got.Before(before) {
			t.Errorf("rollback waited for a status since %v, want the old slot's restarted kubelet %v", got, r.h.started["a"])
		}
	})
	t.Run("restart", func(t *testing.T) {
		t.Parallel()
		r := newRig(t)
		r.request(t, 2) // unclaimed: a restart does not touch it
		before := time.Now()
		if s, err := execute(t, r, Job{Kind: requests.Restart}); err != nil || s.Phase != requests.Succeeded {
			t.Fatalf("restart: %+v %v", s, err)
		}
		if got := lastFloor(r); !got.Equal(r.h.started["a"]) || got.Before(before) {
			t.Errorf("restart waited for a status since %v, want the restarted kubelet %v", got, r.h.started["a"])
		}
	})
}

// cacheDir is the host's artifact cache directory, made.
func (r *rig) cacheDir(t *testing.T) string {
	t.Helper()
	dir, err := r.root.Path(hostroot.CacheDir, artifact.CacheSubdir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// cached lists the names in the cache directory dir.
func cached(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// TestRepavePrunesTheCache: after a committed repave the
// artifact cache keeps what the applied and requested configurations use,
// and loses the old slot's artifacts and killed downloads' temp files.
func TestRepavePrunesTheCache(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	req := r.request(t, 3)
	old := r.active(t).Config
	dir := r.cacheDir(t)
	put := func(name string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stale := strings.Repeat("e", 64)
	for _, n := range append(req.Desired.Digests(), old.RootFS.SHA256, stale, "."+stale+".tmp-123") {
		put(n)
	}
	if s, err := execute(t, r, Job{Kind: requests.Repave}); err != nil || s.Phase != requests.Succeeded {
		t.Fatalf("repave: %+v %v", s, err)
	}
	left := cached(dir)
	for _, d := range req.Desired.Digests() {
		if !slices.Contains(left, d) {
			t.Errorf("the applied configuration's %s was pruned", d)
		}
	}
	for _, gone := range []string{stale, "." + stale + ".tmp-123"} {
		if slices.Contains(left, gone) {
			t.Errorf("%s kept after the repave", gone)
		}
	}
	if old.RootFS.SHA256 != req.Desired.RootFS.SHA256 && slices.Contains(left, old.RootFS.SHA256) {
		t.Error("the old slot's rootfs kept after the repave")
	}
}

// TestResumedCommitReverifies: a repave killed inside
// commit (the target's configuration saved and set active, the boot link not
// moved) and a power cut (the old slot boots) resumes by starting and
// verifying the target again, never by committing a slot whose node is not
// running; when the target no longer comes up, the commit is taken back.
func TestResumedCommitReverifies(t *testing.T) {
	t.Parallel()
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("target broken %v", broken), func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			// The resumed verify of a broken target waits this long.
			desired := testConfig(t, "new")
			desired.Timeouts.NodeReady.Duration = 300 * time.Millisecond
			req := r.requestConfig(t, 5, desired)
			r.d.Pause = crashAt(Commit)
			if _, err := execute(t, r, Job{Kind: requests.Repave}); !errors.Is(err, errCrash) {
				t.Fatalf("first run: %v", err)
			}
			// The part of commit that ran before the kill.
			a, err := isolation.NewApplied("b", req.Desired, "test", time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if err := r.d.Store.SaveApplied(a); err != nil {
				t.Fatal(err)
			}
			if err := r.d.Store.SetActive("b"); err != nil {
				t.Fatal(err)
			}
			r.h.running = map[string]bool{"a": true} // power cut: the boot link still starts a
			r.h.broken["b"] = broken
			r.d.Pause = nil
			s, err := execute(t, r, Job{Kind: requests.Repave})
			if !broken {
				if err != nil || s.Phase != requests.Succeeded || !r.h.running["b"] || r.h.running["a"] {
					t.Fatalf("resume: %+v %v, running %v", s, err, r.h.running)
				}
				return
			}
			if !errors.Is(err, ErrRolledBack) {
				t.Fatalf("resume with a broken target: %+v %v", s, err)
			}
			if act := r.active(t); act.Slot != "a" || !r.h.running["a"] || r.h.running["b"] {
				t.Errorf("after the rollback: active %s, running %v", act.Slot, r.h.running)
			}
			if _, err := r.d.Store.LoadApplied("b"); err == nil {
				t.Error("the failed target's applied configuration is still there")
			}
		})
	}
}

// TestStopIsNotFailure: a repave stopped by SIGTERM (its
// context cancelled) in prepare or verify neither fails the request nor
// rolls back; the state file keeps the phase, and the next run resumes and
// finishes it.
func TestStopIsNotFailure(t *testing.T) {
	t.Parallel()
	for _, p := range []Phase{Prepare, Verify} {
		t.Run(string(p), func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			req := r.request(t, 6)
			ctx, cancel := context.WithCancel(context.Background())
			r.d.Pause = func(_ context.Context, name string) error {
				q := Phase(name)
				if q == p {
					cancel() // SIGTERM while the phase runs
				}
				return nil
			}
			l := lock(t, r)
			_, err := Execute(ctx, r.d, l, Job{Kind: requests.Repave})
			l.Release()
			if err == nil || !strings.Contains(err.Error(), "the next start resumes it") {
				t.Fatalf("stopped run: %v", err)
			}
			if st, _ := r.d.Requests.ReadStatus(req.ID); st != nil && st.Phase.Finished() {
				t.Errorf("a stopped repave reported %s: %s", st.Phase, st.Message)
			}
			if st, err := LoadState(r.root); err != nil || st == nil || st.Phase != p {
				t.Fatalf("state after the stop: %+v %v, want phase %s kept", st, err, p)
			}
			if slices.Contains(strings.Fields(r.h.callList()), "stop:b") {
				t.Errorf("rolled back after a stop: %s", r.h.callList())
			}
			r.d.Pause = nil
			if s, err := execute(t, r, Job{Kind: requests.Repave}); err != nil || s.Phase != requests.Succeeded {
				t.Errorf("resume after the stop: %+v %v", s, err)
			}
		})
	}
}

// A repave.json that holds a restart (no desired configuration) panicked the
// repaver on every run: it is moved aside with a Failed
// status, the host untouched, and a second run finds nothing.
func TestOtherKindsRequestRefused(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	p, err := r.d.Requests.RequestPath(requests.Repave)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(`{"kind":"restart","id":"restart-4-op-x","operation":"op-x"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if s, err := execute(t, r, Job{Kind: requests.Repave, Triggered: true}); err != nil || s != nil {
			t.Fatalf("run %d: %+v, %v; want nothing to do", i, s, err)
		}
	}
	if s, err := r.d.Requests.ReadStatus("restart-4-op-x"); err != nil || s.Phase != requests.Failed {
		t.Fatalf("status: %+v, %v", s, err)
	}
	if r.h.callList() != "" {
		t.Errorf("the host was touched: %s", r.h.callList())
	}
}

// TestRunStartTidiesTheCache: any repaver run (here a
// restart, which downloads nothing) first removes, under the lock, what a
// killed download left and what nothing uses, and keeps what the applied
// configuration and a pending repave use.
func TestRunStartTidiesTheCache(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	applied := r.active(t).Config
	pending := r.request(t, 3) // a repave waiting its turn
	dir := r.cacheDir(t)
	stale := strings.Repeat("e", 64)
	names := append(append(slices.Clone(applied.Digests()), pending.Desired.Digests()...), stale, "."+stale+".tmp-7")
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.d.Requests.Write(&requests.Request{Kind: requests.Restart, ID: requests.NewID(requests.Restart, 3, "op"),
		MachineGeneration: 3, Operation: "op", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	if s, err := execute(t, r, Job{Kind: requests.Restart}); err != nil || s.Phase != requests.Succeeded {
		t.Fatalf("restart: %+v %v", s, err)
	}
	left := cached(dir)
	for _, d := range append(applied.Digests(), pending.Desired.Digests()...) {
		if !slices.Contains(left, d) {
			t.Errorf("%s in use was pruned", d)
		}
	}
	for _, gone := range []string{stale, "." + stale + ".tmp-7"} {
		if slices.Contains(left, gone) {
			t.Errorf("%s kept after the run", gone)
		}
	}
}

// A triggered run whose only request was moved aside says so, naming the
// file and why, not "no request to claim" as if nobody had asked.
func TestRefusedRequestLoggedAsRefused(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	var logs bytes.Buffer
	r.d.Log = slog.New(slog.NewTextHandler(&logs, nil))
	p, err := r.d.Requests.RequestPath(requests.Repave)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(`{"kind":"restart","id":"restart-4-op"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err := execute(t, r, Job{Kind: requests.Repave, Triggered: true}); s != nil || err != nil {
		t.Fatalf("triggered with a refused request: %+v, %v", s, err)
	}
	out := logs.String()
	for _, want := range []string{"request refused and moved aside", "requests/repave.json", "holds a restart request", "state/rejected-repave-request-"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "no request to claim") {
		t.Errorf("a refused request logged as no request:\n%s", out)
	}
}
