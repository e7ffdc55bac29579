package repave

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/requests"
)

// TestSlotLostBeforeDisruption: a paced rollout's repave whose slot the
// watcher lost before the drain stops there: nothing evicted, the old node
// never stopped, the status Failed and saying why.
func TestSlotLostBeforeDisruption(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	req := r.request(t, 3)
	if err := r.d.Requests.MarkSlotLost(req.ID, "lease roll-0 is held by x now"); err != nil {
		t.Fatal(err)
	}
	s, err := execute(t, r, Job{Kind: requests.Repave})
	if err == nil || s == nil || s.Phase != requests.Failed || !strings.Contains(s.Message, "rollout slot was lost") ||
		!strings.Contains(s.Message, "held by x") {
		t.Fatalf("repave without its slot: %+v, %v; want Failed, saying the slot was lost", s, err)
	}
	if calls := r.h.callList(); strings.Contains(calls, "stop:a") || strings.Contains(calls, "evict") || strings.Contains(calls, "cordon") {
		t.Errorf("the node was disrupted without a slot: %s", calls)
	}
	if a := r.active(t); a.Slot != "a" {
		t.Errorf("active slot %s, want a", a.Slot)
	}
}

// TestSlotLostAtTheSwitch: lost during the drain, the repave stops before the
// switch (the point of no return) and rolls back; lost after it, it
// finishes and the status records that it ran without its slot.
func TestSlotLostAtTheSwitch(t *testing.T) {
	t.Parallel()
	t.Run("before the switch", func(t *testing.T) {
		r := newRig(t)
		req := r.request(t, 3)
		r.d.Pause = func(_ context.Context, name string) error {
			if name == string(Switch) {
				return r.d.Requests.MarkSlotLost(req.ID, "lease gone")
			}
			return nil
		}
		s, err := execute(t, r, Job{Kind: requests.Repave})
		if err == nil || s == nil || s.Phase != requests.Failed || !strings.Contains(s.Message, "rollout slot was lost") ||
			!strings.Contains(s.Message, "rolled back") {
			t.Fatalf("%+v, %v; want rolled back for the lost slot", s, err)
		}
		if calls := r.h.callList(); strings.Contains(calls, "stop:a") {
			t.Errorf("the old node was stopped: %s", calls)
		}
	})
	t.Run("after the switch", func(t *testing.T) {
		r := newRig(t)
		req := r.request(t, 3)
		r.d.Pause = func(_ context.Context, name string) error {
			if name == string(Verify) {
				return r.d.Requests.MarkSlotLost(req.ID, "lease gone")
			}
			return nil
		}
		s, err := execute(t, r, Job{Kind: requests.Repave})
		if err != nil || s.Phase != requests.Succeeded || !strings.Contains(s.Message, "lost after the point of no return") {
			t.Fatalf("%+v, %v; want Succeeded, recording the lost slot", s, err)
		}
	})
}

// TestRestartSlotLost: a restart whose slot is lost stops before the drain
// and leaves the node running.
func TestRestartSlotLost(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.d.UncordonWait = 50 * time.Millisecond
	req := &requests.Request{Kind: requests.Restart, ID: requests.NewID(requests.Restart, 3, "op"), MachineGeneration: 3,
		Operation: "op", CreatedAt: time.Now()}
	if _, err := r.d.Requests.Write(req); err != nil {
		t.Fatal(err)
	}
	if err := r.d.Requests.MarkSlotLost(req.ID, "lease gone"); err != nil {
		t.Fatal(err)
	}
	s, err := execute(t, r, Job{Kind: requests.Restart})
	if err == nil || s.Phase != requests.Failed || !strings.Contains(s.Message, "kept running") || !strings.Contains(s.Message, "rollout slot was lost") {
		t.Fatalf("%+v, %v", s, err)
	}
	if calls := r.h.callList(); calls != "" {
		t.Errorf("calls %q: the node was touched", calls)
	}
}
