package watcher

import (
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	nodedrain "github.com/kubeslot/kubeslot/lib/drain"
	"github.com/kubeslot/kubeslot/lib/requests"
)

// TestDisruptionTravelsInTheRequest: the Machine's drain policy is in the
// repave and restart requests, and a change of the policy alone repaves
// nothing (it is not part of the desired configuration).
func TestDisruptionTravelsInTheRequest(t *testing.T) {
	in := base(t)
	in.Machine.Spec.UpdatePolicy = v1alpha1.UpdateImmediate
	in.Machine.Spec.Disruption = &v1alpha1.Disruption{DrainTimeoutSeconds: 300, OnDrainTimeout: v1alpha1.DrainTimeoutForce, DeleteEmptyDirData: true}
	in.Machine.Generation++
	if got := summary(Decide(in)); len(got) != 1 || got[0] != "report Ready" {
		t.Errorf("a policy change alone: %v, want no request", got)
	}
	newVersion(&in)
	in.Operations = []v1alpha1.MachineOperation{op("r1", v1alpha1.OperationNodeRestart, "m1")}
	want := nodedrain.Policy{Timeout: 5 * time.Minute, OnTimeout: nodedrain.Force, DeleteEmptyDirData: true}
	n := 0
	for _, a := range Decide(in) {
		if a.Type != WriteRequest {
			continue
		}
		n++
		if a.Request.Disruption == nil || *a.Request.Disruption != want {
			t.Errorf("request %s carries %+v, want %+v", a.Request.ID, a.Request.Disruption, want)
		}
	}
	if n != 2 {
		t.Errorf("%d requests, want a restart and a repave", n)
	}
	in.Machine.Spec.Disruption = &v1alpha1.Disruption{Drain: v1alpha1.DrainNone}
	if p := disruptionOf(in.Machine); p == nil || !p.Skip {
		t.Errorf("drain None: %+v, want Skip", p)
	}
}

// TestDrainingCondition: the newest status with a drain gives the
// condition: True while it runs (the budget named), False with how it
// ended; none before any drain.
func TestDrainingCondition(t *testing.T) {
	in := base(t)
	if _, ok := drainingCondition(in, 4); ok {
		t.Error("a condition before any drain")
	}
	t0 := time.Now()
	in.Statuses = []*requests.Status{
		{RequestID: "restart-1-old", Phase: requests.Succeeded, UpdatedAt: t0,
			Drain: &nodedrain.Progress{Done: true, Outcome: nodedrain.Drained, Message: "drained"}},
		{RequestID: "repave-4-spec", Phase: requests.InProgress, UpdatedAt: t0.Add(time.Second),
			Drain: &nodedrain.Progress{PodsLeft: 2, BlockingPDB: "default/web", Message: "draining node node-1: 2 pods left; blocked by PodDisruptionBudget default/web"}},
	}
	c, ok := drainingCondition(in, 4)
	if !ok || c.Status != "True" || c.Reason != v1alpha1.ReasonDrainBlocked || !strings.Contains(c.Message, "default/web") {
		t.Errorf("blocked: %+v", c)
	}
	if _, _, _, ok := drainEvent(&c, c); ok {
		t.Error("an Event for an unchanged condition")
	}
	if typ, reason, _, ok := drainEvent(nil, c); !ok || typ != "Warning" || reason != v1alpha1.ReasonDrainBlocked {
		t.Errorf("event %s %s %v", typ, reason, ok)
	}
	in.Statuses[1].Phase = requests.Failed
	in.Statuses[1].Drain = &nodedrain.Progress{Done: true, Outcome: nodedrain.Failed, Message: "not done within 2m"}
	if c, _ := drainingCondition(in, 4); c.Status != "False" || c.Reason != v1alpha1.ReasonDrainFailed {
		t.Errorf("failed: %+v", c)
	}
	in.Statuses[1].Drain.Outcome = nodedrain.Forced
	if c, _ := drainingCondition(in, 4); c.Status != "False" || c.Reason != v1alpha1.ReasonDrainForced {
		t.Errorf("forced: %+v", c)
	}
}

// TestLeftCordonedIsUncordoned: a Node kubeslot cordoned for a request that
// has finished, with no repave or restart pending or running, is
// uncordoned; a cordon of a request still running, or not kubeslot's, is
// left.
func TestLeftCordonedIsUncordoned(t *testing.T) {
	const id = "repave-3-roll"
	uncordons := func(in Inputs) bool {
		for _, a := range Decide(in) {
			if a.Type == Uncordon {
				return a.Status.RequestID == id
			}
		}
		return false
	}
	finished := func() Inputs {
		in := base(t)
		in.NodeCordonedBy = id
		in.Statuses = []*requests.Status{{RequestID: id, Kind: requests.Repave, Operation: "roll", Phase: requests.Failed,
			Message: "drain failed; rolled back"}}
		in.Published = requests.Published{id: requests.Failed}
		return in
	}
	if !uncordons(finished()) {
		t.Error("cordoned by a failed repave, nothing running: want an uncordon")
	}
	in := finished()
	in.Statuses[0].Phase = requests.InProgress
	in.Published = requests.Published{id: requests.InProgress}
	if uncordons(in) {
		t.Error("cordoned by a repave still in progress: uncordoned")
	}
	in = finished()
	in.Claimed[requests.Restart] = &requests.Request{ID: "restart-4-other", Kind: requests.Restart, Operation: "other"}
	if uncordons(in) {
		t.Error("a restart claimed (its drain may resume the cordon): uncordoned")
	}
	in = finished()
	in.NodeCordonedBy = ""
	if uncordons(in) {
		t.Error("a cordon that is not kubeslot's: uncordoned")
	}
	in = finished()
	in.Statuses = nil
	if uncordons(in) {
		t.Error("the cordoning request has no final status on this host: uncordoned")
	}
}
