package watcher

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/requests"
)

// pacedOp is a Repave of every Machine labelled pool=p, one at a time.
func pacedOp(r v1alpha1.Rollout) v1alpha1.MachineOperation {
	o := v1alpha1.MachineOperation{Spec: v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationRepave,
		MachineSelector: &v1alpha1.MachineSelector{MatchLabels: map[string]string{"pool": "p"}}, Rollout: &r}}
	o.Name = "roll"
	return o
}

func entry(name string, ph v1alpha1.OperationPhase, key string) v1alpha1.MachineOperationTarget {
	return v1alpha1.MachineOperationTarget{Name: name, NodeName: "n-" + name, Phase: ph, OrderKey: key}
}

func slotSummary(as []Action) []string {
	var out []string
	for _, a := range as {
		switch a.Type {
		case WriteRequest:
			out = append(out, "write "+a.Request.ID)
		case AwaitSlot:
			s := "await"
			if a.Gate.Try {
				s += " try"
			}
			if a.Gate.Stop {
				s += " stop"
			}
			out = append(out, s)
		case SoakSlot:
			out = append(out, fmt.Sprintf("SoakSlot %s", a.Until.Sub(soakBase).Round(time.Second)))
		case KeepSlot, ReleaseSlot:
			if a.Request != nil {
				out = append(out, string(a.Type)+" publish "+a.Request.ID)
				continue
			}
			out = append(out, string(a.Type))
		}
	}
	return out
}

// soakBase is when the cases' own entries say they finished.
var soakBase = time.Now().Truncate(time.Second)

func TestDecideRolloutWaitsForSlot(t *testing.T) {
	one := int32(1)
	cases := []struct {
		name   string
		r      v1alpha1.Rollout
		others []v1alpha1.MachineOperationTarget
		mine   v1alpha1.OperationPhase // "" none
		held   bool
		onDisk bool
		// pending: the request is on disk, no worker status yet
		pending bool
		// missing targets have not reported; age is the operation's
		missing int32
		age     time.Duration
		// forged entries are in the list but no List vouches for them
		forged []v1alpha1.MachineOperationTarget
		// stop is the emergency stop's message ("" none)
		stop string
		// since is how long ago this Machine's entry finished (at soakBase
		// minus since; now is soakBase)
		since time.Duration
		want  []string
	}{
		{name: "no slot: wait and try", want: []string{"await try"}},
		{name: "slot held: write the request", held: true, want: []string{"write repave-4-roll"}},
		{name: "dispatched: keep the slot", held: true, onDisk: true, mine: v1alpha1.OperationInProgress, want: []string{"KeepSlot"}},
		{name: "dispatched, its Pending entry lost: publish it", held: true, pending: true, mine: v1alpha1.OperationWaiting,
			want: []string{"KeepSlot publish repave-4-roll"}},
		{name: "dispatched, no entry at all: publish it", held: true, pending: true, want: []string{"KeepSlot publish repave-4-roll"}},
		{name: "dispatched and shown Pending: keep the slot", held: true, pending: true, mine: v1alpha1.OperationPending,
			want: []string{"KeepSlot"}},
		{name: "finished: release", held: true, onDisk: true, mine: v1alpha1.OperationSucceeded, want: []string{"ReleaseSlot"}},
		{name: "succeeded, soaking: keep the slot until the soak ends", r: v1alpha1.Rollout{SoakSeconds: 30}, held: true, onDisk: true,
			mine: v1alpha1.OperationSucceeded, since: 10 * time.Second, want: []string{"SoakSlot 20s"}},
		{name: "succeeded, soaked: release", r: v1alpha1.Rollout{SoakSeconds: 30}, held: true, onDisk: true,
			mine: v1alpha1.OperationSucceeded, since: 30 * time.Second, want: []string{"ReleaseSlot"}},
		{name: "failed: no soak, release", r: v1alpha1.Rollout{SoakSeconds: 30}, held: true, onDisk: true,
			mine: v1alpha1.OperationFailed, want: []string{"ReleaseSlot"}},
		{name: "budget spent: halted, nobody tries", r: v1alpha1.Rollout{FailureBudget: &one},
			others: []v1alpha1.MachineOperationTarget{entry("x", v1alpha1.OperationFailed, "")}, want: []string{"await stop"}},
		{name: "budget spent with a slot held: give it back, write nothing", held: true,
			others: []v1alpha1.MachineOperationTarget{entry("x", v1alpha1.OperationFailed, "")}, want: []string{"await stop"}},
		{name: "budget 0 never halts", r: v1alpha1.Rollout{FailureBudget: new(int32)},
			others: []v1alpha1.MachineOperationTarget{entry("x", v1alpha1.OperationFailed, "")}, want: []string{"await try"}},
		{name: "paused", r: v1alpha1.Rollout{Paused: true}, want: []string{"await stop"}},
		{name: "emergency stop: nobody tries", stop: "stopped", want: []string{"await stop"}},
		{name: "emergency stop with a slot held: give it back, write nothing", held: true, stop: "stopped", want: []string{"await stop"}},
		{name: "emergency stop: dispatched work keeps its slot", held: true, onDisk: true, mine: v1alpha1.OperationInProgress,
			stop: "stopped", want: []string{"KeepSlot"}},
		{name: "emergency stop with budget 0 and no order still stops", r: v1alpha1.Rollout{FailureBudget: new(int32)},
			stop: "stopped", want: []string{"await stop"}},
		{name: "ordered: another waiting comes first", r: v1alpha1.Rollout{OrderByLabel: "zone"},
			others: []v1alpha1.MachineOperationTarget{entry("z", v1alpha1.OperationWaiting, "a")}, want: []string{"await"}},
		{name: "ordered: this one first", r: v1alpha1.Rollout{OrderByLabel: "zone"},
			others: []v1alpha1.MachineOperationTarget{entry("a", v1alpha1.OperationWaiting, "c")}, want: []string{"await try"}},
		{name: "ordered: a target has not reported yet", r: v1alpha1.Rollout{OrderByLabel: "zone"}, missing: 1,
			want: []string{"await"}},
		{name: "ordered: a target has not reported within the join window", r: v1alpha1.Rollout{OrderByLabel: "zone"}, missing: 1,
			age: joinWindow + time.Second, want: []string{"await try"}},
		{name: "canary: one slot until it succeeded", r: v1alpha1.Rollout{Canary: 1, MaxUnavailable: &intstr.IntOrString{IntVal: 5}},
			others: []v1alpha1.MachineOperationTarget{entry("a", v1alpha1.OperationWaiting, "")}, want: []string{"await"}},
		{name: "canary done: maxUnavailable", r: v1alpha1.Rollout{Canary: 1, MaxUnavailable: &intstr.IntOrString{IntVal: 5}},
			others: []v1alpha1.MachineOperationTarget{entry("a", v1alpha1.OperationWaiting, ""), entry("c", v1alpha1.OperationSucceeded, "")},
			want:   []string{"await try"}},
		{name: "forged failures do not halt", forged: []v1alpha1.MachineOperationTarget{entry("ghost", v1alpha1.OperationFailed, ""),
			{Name: "x", NodeName: "n-elsewhere", Phase: v1alpha1.OperationFailed}},
			others: []v1alpha1.MachineOperationTarget{entry("x", v1alpha1.OperationWaiting, "")}, want: []string{"await try"}},
		{name: "a forged success does not end the canary", r: v1alpha1.Rollout{Canary: 1, MaxUnavailable: &intstr.IntOrString{IntVal: 5}},
			others: []v1alpha1.MachineOperationTarget{entry("a", v1alpha1.OperationWaiting, "")},
			forged: []v1alpha1.MachineOperationTarget{entry("c", v1alpha1.OperationSucceeded, "")}, want: []string{"await"}},
		{name: "a forged waiter does not come first", r: v1alpha1.Rollout{OrderByLabel: "zone"},
			others: []v1alpha1.MachineOperationTarget{entry("c", v1alpha1.OperationWaiting, "c")},
			forged: []v1alpha1.MachineOperationTarget{entry("ghost", v1alpha1.OperationWaiting, "a")}, want: []string{"await try"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := base(t)
			in.Machine.Labels = map[string]string{"pool": "p", "zone": "b", v1alpha1.LabelEnrolled: "true"}
			o := pacedOp(tc.r)
			o.Status.Machines = append(o.Status.Machines, tc.others...)
			if tc.mine != "" {
				done := metav1.NewTime(soakBase.Add(-tc.since))
				o.Status.Machines = append(o.Status.Machines, v1alpha1.MachineOperationTarget{Name: "m1", NodeName: node, Phase: tc.mine,
					CompletionTime: &done})
			}
			// What this agent Listed; status.targets is a summary any node writes, and says something else.
			in.Targets = map[string]int{o.Name: len(o.Status.Machines) + int(tc.missing)}
			o.Status.Targets = 400
			real := v1alpha1.TargetNodes{}
			for _, e := range o.Status.Machines {
				real[e.Name] = e.NodeName
			}
			o.Status.Machines = append(o.Status.Machines, tc.forged...)
			in.Checks = map[string]func(v1alpha1.MachineOperationTarget) bool{o.Name: real.Check}
			in.Now = soakBase
			o.CreationTimestamp.Time = in.Now.Add(-tc.age)
			in.Operations = []v1alpha1.MachineOperation{o}
			in.Stop = tc.stop
			if tc.held {
				in.Slots = map[string]bool{"roll": true}
			}
			if tc.pending {
				in.Pending = map[requests.Kind]*requests.Request{requests.Repave: {ID: "repave-4-roll", Kind: requests.Repave, Operation: "roll"}}
			}
			if tc.onDisk {
				in.Statuses = []*requests.Status{{RequestID: "repave-4-roll", Kind: requests.Repave, Operation: "roll", Phase: requests.InProgress}}
				in.Published = requests.Published{"repave-4-roll": requests.InProgress}
			}
			got := slotSummary(Decide(in))
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRolloutGateMessages(t *testing.T) {
	in := base(t)
	in.Machine.Labels = map[string]string{"pool": "p", v1alpha1.LabelEnrolled: "true"}
	o := pacedOp(v1alpha1.Rollout{MaxUnavailable: &intstr.IntOrString{Type: intstr.String, StrVal: "50%"}})
	o.Status.Targets = 5 // written by some node: not a count this agent made
	g := rolloutGate(&o, in.Machine, node, time.Now(), v1alpha1.CountAll, 0, "")
	if !g.CountTargets || g.Try || g.Stop {
		t.Errorf("percent before this agent Listed the targets: %+v, want a count first (status.targets is not believed)", g)
	}
	o.Status.Targets = 400
	if g = rolloutGate(&o, in.Machine, node, time.Now(), v1alpha1.CountAll, 5, ""); g.Slots != 2 || !g.Try {
		t.Errorf("50%% of the 5 targets Listed (status.targets says 400): %+v, want 2 slots", g)
	}
	o.Status.Machines = []v1alpha1.MachineOperationTarget{entry("a", v1alpha1.OperationFailed, ""), entry("b", v1alpha1.OperationFailed, "")}
	g = rolloutGate(&o, in.Machine, node, time.Now(), v1alpha1.CountAll, 5, "")
	if !g.Stop || !strings.Contains(g.Message, "halted") || !strings.Contains(g.Message, "[a b]") {
		t.Errorf("halted: %+v, want the failed machines named", g)
	}
}

// A canary counts as done only once its soak is over: until then the
// others wait (in line for the one canary slot it holds) and decide again
// when it ends.
func TestRolloutGateCanarySoak(t *testing.T) {
	in := base(t)
	in.Machine.Labels = map[string]string{"pool": "p", v1alpha1.LabelEnrolled: "true"}
	o := pacedOp(v1alpha1.Rollout{Canary: 1, SoakSeconds: 60, MaxUnavailable: &intstr.IntOrString{IntVal: 2}})
	now := time.Now()
	done := metav1.NewTime(now.Add(-20 * time.Second))
	o.Status.Machines = []v1alpha1.MachineOperationTarget{{Name: "a", NodeName: "n-a", Phase: v1alpha1.OperationSucceeded, CompletionTime: &done}}
	o.CreationTimestamp.Time = now.Add(-time.Hour)
	g := rolloutGate(&o, in.Machine, node, now, v1alpha1.CountAll, 3, "")
	if g.Slots != 1 || g.Recheck != 40*time.Second || !strings.Contains(g.Message, "canary") {
		t.Errorf("canary soaking: %+v, want 1 slot, a recheck in 40s", g)
	}
	g = rolloutGate(&o, in.Machine, node, now.Add(41*time.Second), v1alpha1.CountAll, 3, "")
	if g.Slots != 2 || !g.Try || g.Recheck != 0 {
		t.Errorf("canary soaked: %+v, want 2 slots and a try", g)
	}
}

func TestRolloutGateEmergencyStop(t *testing.T) {
	in := base(t)
	in.Machine.Labels = map[string]string{"pool": "p", v1alpha1.LabelEnrolled: "true"}
	o := pacedOp(v1alpha1.Rollout{})
	stop := v1alpha1.StopMessage([]v1alpha1.RolloutStop{{Spec: v1alpha1.RolloutStopSpec{Reason: "incident 7"}}})
	g := rolloutGate(&o, in.Machine, node, time.Now(), v1alpha1.CountAll, 3, stop)
	if !g.Stop || g.Try || g.Message != stop {
		t.Errorf("stopped: %+v, want Stop with %q", g, stop)
	}
}

func TestSummaryHaltedNamesFailures(t *testing.T) {
	o := pacedOp(v1alpha1.Rollout{})
	v1alpha1.SetMachineResult(&o, entry("a", v1alpha1.OperationSucceeded, ""), v1alpha1.CountAll)
	v1alpha1.SetMachineResult(&o, entry("c", v1alpha1.OperationWaiting, ""), v1alpha1.CountAll)
	v1alpha1.SetMachineResult(&o, entry("b", v1alpha1.OperationFailed, ""), v1alpha1.CountAll)
	s := o.Status
	if s.Phase != v1alpha1.OperationHalted || !strings.Contains(s.Message, "b") || s.Done != 1 || s.Failed != 1 || s.Waiting != 1 {
		t.Errorf("status %s %q done=%d failed=%d waiting=%d, want Halted naming b, 1/1/1", s.Phase, s.Message, s.Done, s.Failed, s.Waiting)
	}
	v1alpha1.SetMachineResult(&o, entry("c", v1alpha1.OperationSucceeded, ""), v1alpha1.CountAll)
	if o.Status.Phase != v1alpha1.OperationFailed {
		t.Errorf("all finished with a failure: %s, want Failed", o.Status.Phase)
	}
}

// The book counts an entry only when the List of the operation's targets
// has its Machine with that node name; it Lists again for an unknown entry,
// at most once per interval unless forced.
func TestTargetBook(t *testing.T) {
	o := pacedOp(v1alpha1.Rollout{})
	o.UID = "u1"
	mk := func(name, node, pool string) v1alpha1.Machine {
		m := v1alpha1.Machine{}
		m.Name, m.Spec.NodeName, m.Labels = name, node, map[string]string{"pool": pool, v1alpha1.LabelEnrolled: "true"}
		return m
	}
	lists := 0
	machines := []v1alpha1.Machine{mk("x", "n-x", "p"), mk("y", "n-y", "q")}
	list := func(_ context.Context, sel string) ([]v1alpha1.Machine, error) {
		if want := v1alpha1.LabelEnrolled + "=true,pool=p"; sel != want {
			t.Errorf("listed with selector %q, want %s", sel, want)
		}
		lists++
		return machines, nil // the server's filter left out: the book checks the selector itself
	}
	b := newTargetBook(time.Minute)
	own := mk("m1", node, "p")
	o.Status.Machines = []v1alpha1.MachineOperationTarget{
		entry("x", v1alpha1.OperationFailed, ""),                         // real
		entry("ghost", v1alpha1.OperationFailed, ""),                     // no such Machine
		entry("y", v1alpha1.OperationFailed, ""),                         // not targeted
		{Name: "x", NodeName: "n-evil", Phase: v1alpha1.OperationFailed}, // wrong node
		{Name: "m1", NodeName: node, Phase: v1alpha1.OperationWaiting},   // this agent's own
	}
	if got := v1alpha1.Counted(&o, b.check(&o, &own, node)); len(got) != 1 || got[0].Name != "m1" {
		t.Errorf("before any List: counted %v, want the own entry only", got)
	}
	now := time.Now()
	if ok, err := b.refresh(context.Background(), list, &o, false, now); !ok || err != nil || lists != 1 {
		t.Fatalf("refresh: %v, %v after %d Lists", ok, err, lists)
	}
	got := v1alpha1.Counted(&o, b.check(&o, &own, node))
	if len(got) != 2 || got[0].Name != "x" || got[0].NodeName != "n-x" || got[1].Name != "m1" {
		t.Errorf("counted %v, want x on n-x and the own entry", got)
	}
	// Nothing unknown: no List. A new entry: one List per interval.
	if ok, _ := b.refresh(context.Background(), list, &o, false, now); !ok || lists != 1 {
		t.Errorf("nothing new: complete %v after %d Lists, want no second List", ok, lists)
	}
	o.Status.Machines = append(o.Status.Machines, entry("z", v1alpha1.OperationFailed, ""))
	if ok, _ := b.refresh(context.Background(), list, &o, false, now.Add(time.Second)); ok || lists != 1 {
		t.Errorf("unknown entry within the interval: complete %v after %d Lists, want incomplete, no List", ok, lists)
	}
	machines = append(machines, mk("z", "n-z", "p"))
	if ok, _ := b.refresh(context.Background(), list, &o, true, now.Add(time.Second)); !ok || lists != 2 {
		t.Errorf("forced: complete %v after %d Lists", ok, lists)
	}
	if got := v1alpha1.Counted(&o, b.check(&o, &own, node)); len(got) != 3 {
		t.Errorf("after z's Machine appeared: counted %v, want x, m1 and z", got)
	}
	// An operation created again under the name starts over.
	o2 := o
	o2.UID = "u2"
	b.keep([]v1alpha1.MachineOperation{o2})
	if got := v1alpha1.Counted(&o2, b.check(&o2, &own, node)); len(got) != 1 {
		t.Errorf("a new operation of the same name: counted %v, want the own entry only", got)
	}
}

// Outside the operation's or the Machine's windows nobody takes a slot,
// and the gate decides again when the next window opens; a window that
// cannot be read refuses, naming it.
func TestRolloutGateWindows(t *testing.T) {
	in := base(t)
	in.Machine.Labels = map[string]string{"pool": "p", v1alpha1.LabelEnrolled: "true"}
	now := time.Date(2026, 12, 4, 21, 0, 0, 0, time.UTC) // a Friday
	friday := []v1alpha1.MaintenanceWindow{{Days: []v1alpha1.Weekday{"Fri"}, Start: "22:00", Duration: "4h"}}
	o := pacedOp(v1alpha1.Rollout{Windows: friday})
	g := rolloutGate(&o, in.Machine, node, now, v1alpha1.CountAll, 3, "")
	if !g.Stop || g.Recheck != time.Hour || !strings.Contains(g.Message, "spec.rollout.windows") ||
		!strings.Contains(g.Message, "Fri 2026-12-04 22:00 UTC") {
		t.Errorf("before the window: %+v, want a stop until Friday 22:00, an hour from now", g)
	}
	if g = rolloutGate(&o, in.Machine, node, now.Add(2*time.Hour), v1alpha1.CountAll, 3, ""); g.Stop || !g.Try {
		t.Errorf("in the window, past midnight: %+v, want a try", g)
	}
	m := in.Machine.DeepCopy()
	m.Spec.MaintenanceWindows = []v1alpha1.MaintenanceWindow{{Start: "03:00", Duration: "1h", TimeZone: "Europe/Berlin"}}
	g = rolloutGate(&o, m, node, now.Add(2*time.Hour), v1alpha1.CountAll, 3, "")
	if !g.Stop || !strings.Contains(g.Message, "Machine m1 spec.maintenanceWindows") || g.Recheck != 3*time.Hour {
		t.Errorf("the operation's window open, the Machine's not (opens at 02:00 UTC, 3 h on): %+v", g)
	}
	m.Spec.MaintenanceWindows[0].TimeZone = "Mars/Olympus"
	g = rolloutGate(&o, m, node, now.Add(2*time.Hour), v1alpha1.CountAll, 3, "")
	if !g.Stop || !strings.Contains(g.Message, `refused: Machine m1 spec.maintenanceWindows[0].timeZone "Mars/Olympus"`) {
		t.Errorf("an unknown zone: %+v, want a refusal naming the field and value", g)
	}
	g = rolloutGate(&o, in.Machine, node, now, v1alpha1.CountAll, 3, "stopped")
	if g.Message != "stopped" {
		t.Errorf("the emergency stop is said before the window: %+v", g)
	}
}
