package watcher

import (
	"strings"
	"testing"
	"time"

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
		case KeepSlot, ReleaseSlot:
			out = append(out, string(a.Type))
		}
	}
	return out
}

func TestDecideRolloutWaitsForSlot(t *testing.T) {
	one := int32(1)
	cases := []struct {
		name   string
		r      v1alpha1.Rollout
		others []v1alpha1.MachineOperationTarget
		mine   v1alpha1.OperationPhase // "" none
		held   bool
		onDisk bool
		// missing targets have not reported; age is the operation's
		missing int32
		age     time.Duration
		want    []string
	}{
		{name: "no slot: wait and try", want: []string{"await try"}},
		{name: "slot held: write the request", held: true, want: []string{"write repave-4-roll"}},
		{name: "dispatched: keep the slot", held: true, onDisk: true, mine: v1alpha1.OperationInProgress, want: []string{"KeepSlot"}},
		{name: "finished: release", held: true, onDisk: true, mine: v1alpha1.OperationSucceeded, want: []string{"ReleaseSlot"}},
		{name: "budget spent: halted, nobody tries", r: v1alpha1.Rollout{FailureBudget: &one},
			others: []v1alpha1.MachineOperationTarget{entry("x", v1alpha1.OperationFailed, "")}, want: []string{"await stop"}},
		{name: "budget spent with a slot held: give it back, write nothing", held: true,
			others: []v1alpha1.MachineOperationTarget{entry("x", v1alpha1.OperationFailed, "")}, want: []string{"await stop"}},
		{name: "budget 0 never halts", r: v1alpha1.Rollout{FailureBudget: new(int32)},
			others: []v1alpha1.MachineOperationTarget{entry("x", v1alpha1.OperationFailed, "")}, want: []string{"await try"}},
		{name: "paused", r: v1alpha1.Rollout{Paused: true}, want: []string{"await stop"}},
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
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := base(t)
			in.Machine.Labels = map[string]string{"pool": "p", "zone": "b"}
			o := pacedOp(tc.r)
			o.Status.Machines = append(o.Status.Machines, tc.others...)
			if tc.mine != "" {
				o.Status.Machines = append(o.Status.Machines, v1alpha1.MachineOperationTarget{Name: "m1", NodeName: node, Phase: tc.mine})
			}
			o.Status.Targets = int32(len(o.Status.Machines)) + tc.missing
			in.Now = time.Now()
			o.CreationTimestamp.Time = in.Now.Add(-tc.age)
			in.Operations = []v1alpha1.MachineOperation{o}
			if tc.held {
				in.Slots = map[string]bool{"roll": true}
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
	in.Machine.Labels = map[string]string{"pool": "p"}
	o := pacedOp(v1alpha1.Rollout{MaxUnavailable: &intstr.IntOrString{Type: intstr.String, StrVal: "50%"}})
	g := rolloutGate(&o, in.Machine, node, time.Now())
	if !g.CountTargets || g.Try || g.Stop {
		t.Errorf("percent without status.targets: %+v, want a count first", g)
	}
	o.Status.Targets = 5
	if g = rolloutGate(&o, in.Machine, node, time.Now()); g.Slots != 2 || !g.Try {
		t.Errorf("50%% of 5: %+v, want 2 slots", g)
	}
	o.Status.Machines = []v1alpha1.MachineOperationTarget{entry("a", v1alpha1.OperationFailed, ""), entry("b", v1alpha1.OperationFailed, "")}
	g = rolloutGate(&o, in.Machine, node, time.Now())
	if !g.Stop || !strings.Contains(g.Message, "halted") || !strings.Contains(g.Message, "[a b]") {
		t.Errorf("halted: %+v, want the failed machines named", g)
	}
}

func TestSummaryHaltedNamesFailures(t *testing.T) {
	o := pacedOp(v1alpha1.Rollout{})
	v1alpha1.SetMachineResult(&o, entry("a", v1alpha1.OperationSucceeded, ""))
	v1alpha1.SetMachineResult(&o, entry("c", v1alpha1.OperationWaiting, ""))
	v1alpha1.SetMachineResult(&o, entry("b", v1alpha1.OperationFailed, ""))
	s := o.Status
	if s.Phase != v1alpha1.OperationHalted || !strings.Contains(s.Message, "b") || s.Done != 1 || s.Failed != 1 || s.Waiting != 1 {
		t.Errorf("status %s %q done=%d failed=%d waiting=%d, want Halted naming b, 1/1/1", s.Phase, s.Message, s.Done, s.Failed, s.Waiting)
	}
	v1alpha1.SetMachineResult(&o, entry("c", v1alpha1.OperationSucceeded, ""))
	if o.Status.Phase != v1alpha1.OperationFailed {
		t.Errorf("all finished with a failure: %s, want Failed", o.Status.Phase)
	}
}
