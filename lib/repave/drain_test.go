package repave

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/drain"
	"github.com/kubeslot/kubeslot/lib/requests"
)

// requestPolicy drops a repave request with the drain policy p.
func (r *rig) requestPolicy(t *testing.T, gen int64, p *drain.Policy) {
	t.Helper()
	req := &requests.Request{Kind: requests.Repave, ID: requests.NewID(requests.Repave, gen, ""), MachineGeneration: gen,
		Reason: "spec changed", Desired: testConfig(t, "new"), Disruption: p, CreatedAt: time.Now()}
	if _, err := r.d.Requests.Write(req); err != nil {
		t.Fatal(err)
	}
}

// TestDrainTimeoutFailRollsBack: a budget that blocks past the timeout
// under Fail fails the repave in drain, before the old node is touched; the
// rollback uncordons the Node, and the status names the budget.
func TestDrainTimeoutFailRollsBack(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.dr.blocked["web"] = true
	r.requestPolicy(t, 2, &drain.Policy{Timeout: 60 * time.Millisecond, OnTimeout: drain.Fail})
	s, err := execute(t, r, Job{Kind: requests.Repave})
	if !errors.Is(err, ErrRolledBack) || s.Phase != requests.Failed || !strings.Contains(s.Message, "failed in drain") ||
		!strings.Contains(s.Message, "PodDisruptionBudget default/guard") || s.Downtime != 0 {
		t.Fatalf("%+v, %v", s, err)
	}
	calls := r.h.callList()
	if strings.Contains(calls, "stop:a") || r.dr.cordoned() || !strings.HasSuffix(calls, "uncordon:node1 remove:b") {
		t.Errorf("calls %s; cordoned %v", calls, r.dr.cordoned())
	}
	if s.Drain == nil || s.Drain.Outcome != drain.Failed || s.Drain.BlockingPDB != "default/guard" {
		t.Errorf("drain progress %+v", s.Drain)
	}
	if a := r.active(t); a.Slot != "a" {
		t.Errorf("active %s", a.Slot)
	}
}

// TestDrainTimeoutForceGoesOn: under Force the repave goes on with the
// guarded pod left, says so, and uncordons after verify.
func TestDrainTimeoutForceGoesOn(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.dr.blocked["web"] = true
	r.requestPolicy(t, 2, &drain.Policy{Timeout: 60 * time.Millisecond, OnTimeout: drain.Force})
	s, err := execute(t, r, Job{Kind: requests.Repave})
	if err != nil || s.Phase != requests.Succeeded || !strings.Contains(s.Message, "forced") || !strings.Contains(s.Message, "default/web") {
		t.Fatalf("%+v, %v", s, err)
	}
	if r.dr.cordoned() || s.Drain == nil || s.Drain.Outcome != drain.Forced {
		t.Errorf("cordoned %v, drain %+v", r.dr.cordoned(), s.Drain)
	}
}

// TestDrainKillResume: a repave killed in the middle of its drain (the Node
// cordoned by it, a pod still there) resumes the drain: no second cordon,
// the pod evicted, the old node stopped only after, one uncordon at the end.
func TestDrainKillResume(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.request(t, 4)
	r.d.Pause = crashAt(Drain)
	if _, err := execute(t, r, Job{Kind: requests.Repave}); !errors.Is(err, errCrash) {
		t.Fatalf("first run: %v", err)
	}
	r.dr.node = drain.Node{Unschedulable: true, CordonedBy: requests.NewID(requests.Repave, 4, "")} // what the killed drain did
	r.d.Pause = nil
	s, err := execute(t, r, Job{Kind: requests.Repave})
	if err != nil || s.Phase != requests.Succeeded {
		t.Fatalf("%+v, %v", s, err)
	}
	if got, want := r.h.callList(), "provision:b configure:b warm:b evict:web stop:a stop:a start:b boot:b uncordon:node1 remove:a"; got != want {
		t.Errorf("calls %q, want %q", got, want)
	}
}

// TestPersonsCordonStays: a Node a person cordoned is drained but not
// uncordoned after the repave.
func TestPersonsCordonStays(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.dr.node.Unschedulable = true
	r.request(t, 2)
	if s, err := execute(t, r, Job{Kind: requests.Repave}); err != nil || s.Phase != requests.Succeeded {
		t.Fatalf("%+v, %v", s, err)
	}
	if !r.dr.cordoned() || r.h.count("cordon:node1")+r.h.count("uncordon:node1") != 0 || r.h.count("evict:web") != 1 {
		t.Errorf("cordoned %v; calls %s", r.dr.cordoned(), r.h.callList())
	}
}

// TestRestartDrainFails: a restart whose drain fails never stops the node,
// and uncordons it; --no-drain by hand touches neither Node nor pods.
func TestRestartDrainFails(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.dr.err = errors.New("connection refused")
	r.d.UncordonWait = 50 * time.Millisecond
	req := &requests.Request{Kind: requests.Restart, ID: requests.NewID(requests.Restart, 3, "op"), MachineGeneration: 3,
		Operation: "op", Disruption: &drain.Policy{Timeout: 50 * time.Millisecond}, CreatedAt: time.Now()}
	if _, err := r.d.Requests.Write(req); err != nil {
		t.Fatal(err)
	}
	s, err := execute(t, r, Job{Kind: requests.Restart, SkipDrain: true}) // a request is drained all the same
	if err == nil || s.Phase != requests.Failed || !strings.Contains(s.Message, "kept running") || !strings.Contains(s.Message, "connection refused") {
		t.Fatalf("%+v, %v", s, err)
	}
	if calls := r.h.callList(); calls != "" {
		t.Errorf("calls %q: the node was touched", calls)
	}
	r.dr.err = nil
	if s, err := execute(t, r, Job{Kind: requests.Restart, SkipDrain: true}); err != nil || s.Phase != requests.Succeeded {
		t.Fatalf("--no-drain: %+v, %v", s, err)
	}
	if calls := r.h.callList(); calls != "stop:a start:a" {
		t.Errorf("--no-drain: calls %q", calls)
	}
}

// TestDrainPolicyFitsTheStageBudget: the drain's timeout is shortened to
// what the stage budget leaves after the rest of the run's worst case.
func TestDrainPolicyFitsTheStageBudget(t *testing.T) {
	cfg := &config.Config{} // the default timeouts: 30s + 10m + 2 × (90s + 5m) = 23.5m of 28m
	p, note := drainPolicy(nil, cfg, true)
	if p.Timeout != 0 || note != "" {
		t.Errorf("default: %+v %q", p, note)
	}
	p, note = drainPolicy(&drain.Policy{Timeout: drain.MaxTimeout, OnTimeout: drain.Force}, cfg, true)
	if p.Timeout != 4*time.Minute+30*time.Second || p.OnTimeout != drain.Force || !strings.Contains(note, "shortened") {
		t.Errorf("20m: %+v %q", p, note)
	}
	// A restart downloads nothing: 28m - (30s + 2 × (90s + 5m)) = 14.5m.
	if p, _ = drainPolicy(&drain.Policy{Timeout: drain.MaxTimeout}, cfg, false); p.Timeout != 14*time.Minute+30*time.Second {
		t.Errorf("restart: %s", p.Timeout)
	}
}
