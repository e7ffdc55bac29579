package watcher

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/machineclient"
)

var ttlNow = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

// finishedOp is an operation for Machine m1 on node that finished (phase)
// at done, with this Machine's entry, uid and resourceVersion set.
func finishedOp(name string, ttl int32, phase v1alpha1.OperationPhase, done time.Time) v1alpha1.MachineOperation {
	o := op(name, v1alpha1.OperationNodeRestart, "m1")
	o.UID, o.ResourceVersion = types.UID("uid-"+name), "7"
	o.Spec.TTLSecondsAfterFinished = &ttl
	start := metav1.NewTime(done.Add(-time.Minute))
	end := metav1.NewTime(done)
	v1alpha1.SetMachineResult(&o, v1alpha1.MachineOperationTarget{Name: "m1", NodeName: node, Phase: phase,
		Message: "done", StartTime: &start, CompletionTime: &end}, v1alpha1.CountAll)
	return o
}

func TestExpiries(t *testing.T) {
	m := NewMachine("m1", node, applied(t))
	m.Labels = map[string]string{"pool": "p1"}
	ago := func(d time.Duration) time.Time { return ttlNow.Add(-d) }
	selector := func(o v1alpha1.MachineOperation) v1alpha1.MachineOperation {
		o.Spec.MachineRef = nil
		o.Spec.MachineSelector = &v1alpha1.MachineSelector{MatchLabels: map[string]string{"pool": "p1"}}
		return o
	}
	cases := []struct {
		name string
		op   func() v1alpha1.MachineOperation
		// due: deleted now; next: the timer's expiry when not due ("" none)
		due  bool
		next time.Duration
	}{
		{"unfinished", func() v1alpha1.MachineOperation {
			// only the summary says so: this Machine's entry is done, another target's not
			o := finishedOp("o", 10, v1alpha1.OperationSucceeded, ago(time.Hour))
			o.Status.Phase = v1alpha1.OperationInProgress
			return o
		}, false, 0},
		{"finished without completionTime", func() v1alpha1.MachineOperation {
			o := finishedOp("o", 10, v1alpha1.OperationSucceeded, ago(time.Hour))
			o.Status.CompletionTime = nil
			return o
		}, false, 0},
		{"no ttl", func() v1alpha1.MachineOperation {
			o := finishedOp("o", 10, v1alpha1.OperationSucceeded, ago(time.Hour))
			o.Spec.TTLSecondsAfterFinished = nil
			return o
		}, false, 0},
		{"ttl 0: due when finished", func() v1alpha1.MachineOperation {
			return finishedOp("o", 0, v1alpha1.OperationSucceeded, ttlNow)
		}, true, 0},
		{"not yet due", func() v1alpha1.MachineOperation {
			return finishedOp("o", 60, v1alpha1.OperationSucceeded, ago(20*time.Second))
		}, false, 40 * time.Second},
		{"due", func() v1alpha1.MachineOperation {
			return finishedOp("o", 60, v1alpha1.OperationSucceeded, ago(61*time.Second))
		}, true, 0},
		{"due exactly now", func() v1alpha1.MachineOperation {
			return finishedOp("o", 60, v1alpha1.OperationFailed, ago(60*time.Second))
		}, true, 0},
		{"failed counts as finished", func() v1alpha1.MachineOperation {
			return finishedOp("o", 1, v1alpha1.OperationFailed, ago(time.Hour))
		}, true, 0},
		{"other machine (machineRef)", func() v1alpha1.MachineOperation {
			o := finishedOp("o", 1, v1alpha1.OperationSucceeded, ago(time.Hour))
			o.Spec.MachineRef.Name = "m2"
			return o
		}, false, 0},
		{"entry of this Machine under another node", func() v1alpha1.MachineOperation {
			o := finishedOp("o", 1, v1alpha1.OperationSucceeded, ago(time.Hour))
			o.Status.Machines[0].NodeName = "node-2"
			return o
		}, false, 0},
		{"selector op with this Machine's entry: the cluster side's to expire", func() v1alpha1.MachineOperation {
			return selector(finishedOp("o", 1, v1alpha1.OperationSucceeded, ago(time.Hour)))
		}, false, 0},
		{"selector op without this Machine's entry", func() v1alpha1.MachineOperation {
			o := selector(finishedOp("o", 1, v1alpha1.OperationSucceeded, ago(time.Hour)))
			o.Status.Machines[0].Name = "m2"
			o.Status.Machines[0].NodeName = "node-2"
			return o
		}, false, 0},
		{"selector op failed elsewhere, this Machine still running", func() v1alpha1.MachineOperation {
			o := selector(finishedOp("o", 1, v1alpha1.OperationFailed, ago(time.Hour)))
			o.Status.Machines = append(o.Status.Machines, v1alpha1.MachineOperationTarget{Name: "m1", NodeName: node, Phase: v1alpha1.OperationInProgress})
			o.Status.Machines[0].Name, o.Status.Machines[0].NodeName = "m2", "node-2"
			return o
		}, false, 0},
		{"being deleted already", func() v1alpha1.MachineOperation {
			o := finishedOp("o", 1, v1alpha1.OperationSucceeded, ago(time.Hour))
			ts := metav1.NewTime(ttlNow)
			o.DeletionTimestamp = &ts
			return o
		}, false, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := c.op()
			due, next := Expiries([]v1alpha1.MachineOperation{o}, m, node, ttlNow)
			if got := len(due) == 1; got != c.due || len(due) > 1 {
				t.Errorf("due %+v, want due=%v", due, c.due)
			}
			if len(due) == 1 && (due[0].Name != "o" || due[0].UID != o.UID || due[0].ResourceVersion != "7" ||
				due[0].TTL != time.Duration(*o.Spec.TTLSecondsAfterFinished)*time.Second) {
				t.Errorf("due %+v: want o's name, UID, resourceVersion and TTL", due[0])
			}
			var wantNext time.Time
			if c.next > 0 {
				wantNext = ttlNow.Add(c.next)
			}
			if !next.Equal(wantNext) {
				t.Errorf("next %v, want %v", next, wantNext)
			}
		})
	}

	// Several: due oldest first, the timer for the earliest of the rest.
	ops := []v1alpha1.MachineOperation{
		finishedOp("late", 300, v1alpha1.OperationSucceeded, ago(time.Minute)),
		finishedOp("b", 10, v1alpha1.OperationSucceeded, ago(time.Minute)),
		finishedOp("soon", 90, v1alpha1.OperationSucceeded, ago(time.Minute)),
		finishedOp("a", 20, v1alpha1.OperationSucceeded, ago(time.Hour)),
	}
	due, next := Expiries(ops, m, node, ttlNow)
	var names []string
	for _, x := range due {
		names = append(names, x.Name)
	}
	if strings.Join(names, ",") != "a,b" || !next.Equal(ttlNow.Add(30*time.Second)) {
		t.Errorf("due %v, next %v; want a,b and %v", names, next, ttlNow.Add(30*time.Second))
	}
	// No Machine, or a Machine of another node: nothing.
	for _, mm := range []*v1alpha1.Machine{nil, NewMachine("m1", "node-2", applied(t))} {
		if due, next := Expiries(ops, mm, node, ttlNow); len(due) != 0 || !next.IsZero() {
			t.Errorf("Machine %v: due %v next %v, want nothing", mm, due, next)
		}
	}
}

// fakeDeletes answers DELETE of operations with code (200 when 0) and
// counts every request.
type fakeDeletes struct {
	mu       sync.Mutex
	code     int
	requests []string
}

func (f *fakeDeletes) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	body, _ := io.ReadAll(r.Body)
	f.requests = append(f.requests, r.Method+" "+r.URL.Path+" "+string(body))
	code := f.code
	if code == 0 {
		code = http.StatusOK
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	status := "Success"
	if code != http.StatusOK {
		status = "Failure"
	}
	fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":%q,"code":%d,"reason":%q}`, status, code, http.StatusText(code))
}

func (f *fakeDeletes) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.requests)
}

func newTTLLoop(t *testing.T, f *fakeDeletes) *loop {
	t.Helper()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	mc, err := machineclient.New(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	l := &loop{Options: Options{Log: slog.New(slog.NewTextHandler(t.Output(), nil)), CallTimeout: 5 * time.Second},
		mc: mc, kick: make(chan struct{}, 1)}
	t.Cleanup(l.ttl.stop)
	return l
}

// expire deletes what is due, with preconditions, once; a refused delete is
// not tried again until the object changes; nothing due makes no request
// and arms the timer, which nudges the loop.
func TestExpire(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	in := base(t)
	in.Operations = []v1alpha1.MachineOperation{finishedOp("gone", 1, v1alpha1.OperationSucceeded, now.Add(-time.Minute))}

	f := &fakeDeletes{}
	l := newTTLLoop(t, f)
	l.expire(ctx, in)
	if f.count() != 1 || !strings.HasPrefix(f.requests[0], "DELETE /apis/kubeslot.dev/v1alpha1/machineoperations/gone ") ||
		!strings.Contains(f.requests[0], `"uid":"uid-gone","resourceVersion":"7"`) {
		t.Fatalf("requests %q, want one DELETE of gone with its UID and resourceVersion", f.requests)
	}
	if l.ttl.timer != nil {
		t.Errorf("a timer is armed with nothing left to expire")
	}

	// 404 and 409: another watcher won; not remembered as failures.
	for _, code := range []int{http.StatusNotFound, http.StatusConflict} {
		f.code = code
		l.expire(ctx, in)
		if len(l.ttl.failed) != 0 {
			t.Errorf("after %d: failures %v, want none", code, l.ttl.failed)
		}
	}

	// 403: remembered for this resourceVersion; no request until it changes.
	f.code = http.StatusForbidden
	l.expire(ctx, in)
	n := f.count()
	l.expire(ctx, in)
	if f.count() != n {
		t.Errorf("a refused delete was tried again for the same resourceVersion: %q", f.requests[n:])
	}
	in.Operations[0].ResourceVersion = "8"
	f.code = 0
	l.expire(ctx, in)
	if f.count() != n+1 || len(l.ttl.failed) != 0 {
		t.Errorf("after the object changed: %d more requests, failures %v; want one, none", f.count()-n, l.ttl.failed)
	}

	// 500: retried after ttlRetry, so the timer is armed for it.
	f.code = http.StatusInternalServerError
	l.expire(ctx, in)
	if fl, ok := l.ttl.failed[in.Operations[0].UID]; !ok || fl.retryAt.IsZero() || l.ttl.timer == nil {
		t.Errorf("after a 500: failure %+v, timer %v; want a retry time and an armed timer", fl, l.ttl.timer)
	}
	n = f.count()
	l.expire(ctx, in)
	if f.count() != n {
		t.Errorf("retried before ttlRetry: %q", f.requests[n:])
	}

	// Not due yet: no request; the timer nudges the loop after the expiry.
	f.code = 0
	in.Operations = []v1alpha1.MachineOperation{finishedOp("soon", 1, v1alpha1.OperationSucceeded, now.Add(300*time.Millisecond-time.Second))}
	n = f.count()
	drain(l.kick)
	l.expire(ctx, in)
	if f.count() != n || l.ttl.timer == nil {
		t.Fatalf("not due: %d requests, timer %v; want none and an armed timer", f.count()-n, l.ttl.timer)
	}
	select {
	case <-l.kick:
		t.Logf("timer fired %v after the expiry", time.Since(now.Add(300*time.Millisecond)).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatal("the timer did not nudge the loop within 10s")
	}
	l.expire(ctx, in)
	if f.count() != n+1 {
		t.Errorf("after the timer: %d requests, want the delete", f.count()-n)
	}
}

// A summary that says Succeeded while a counted target is still in progress
// (written under a forged entry) does not make the operation expire.
func TestExpiriesReadVerifiedSummaries(t *testing.T) {
	m := NewMachine("m1", node, applied(t))
	m.Labels = map[string]string{"pool": "p1"}
	done := ttlNow.Add(-time.Hour)
	o := finishedOp("sel", 60, v1alpha1.OperationSucceeded, done)
	o.Spec.MachineRef, o.Spec.MachineSelector = nil, &v1alpha1.MachineSelector{MatchLabels: map[string]string{"pool": "p1"}}
	o.Status.Machines = append(o.Status.Machines, v1alpha1.MachineOperationTarget{Name: "m2", NodeName: "n2", Phase: v1alpha1.OperationInProgress})
	// the forged summary: Succeeded, finished long ago
	o.Status.Phase = v1alpha1.OperationSucceeded
	in := Inputs{MachineName: "m1", NodeName: node, Machine: m, Operations: []v1alpha1.MachineOperation{o}}
	real := v1alpha1.TargetNodes{"m1": node, "m2": "n2"}
	in.Checks = map[string]func(v1alpha1.MachineOperationTarget) bool{"sel": real.Check}
	if due, _ := Expiries(verifiedSummaries(in), m, node, ttlNow); len(due) != 0 {
		t.Errorf("due %v: a target is in progress, the operation is not finished", due)
	}
	// m2 unknown to the readers (no such Machine): the operation is finished, and still not this watcher's to
	// delete: a selector operation is expired by the cluster side.
	in.Checks["sel"] = v1alpha1.TargetNodes{"m1": node}.Check
	if due, _ := Expiries(verifiedSummaries(in), m, node, ttlNow); len(due) != 0 {
		t.Errorf("due %v: a selector operation is never deleted by a watcher", due)
	}
}
