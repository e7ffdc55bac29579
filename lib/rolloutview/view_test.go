package rolloutview

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

var t0 = time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)

func at(s float64) *metav1.Time {
	t := metav1.NewTime(t0.Add(time.Duration(s * float64(time.Second))))
	return &t
}

func steps(from float64, names ...string) []v1alpha1.OperationStep {
	var out []v1alpha1.OperationStep
	for i, n := range names {
		out = append(out, v1alpha1.OperationStep{Name: n, StartTime: metav1.NewMicroTime(t0.Add(time.Duration((from + float64(i)*2) * float64(time.Second)))),
			DurationMilliseconds: 1500})
	}
	return out
}

// fixture is a halted rollout over four web Machines: web-1 succeeded,
// web-2 failed (its message tries to reach a terminal and a page), web-3
// waits, web-4 wrote nothing yet; a node that is no target forged an
// entry for web-3 under its own name.
func fixture() (*v1alpha1.MachineOperation, []v1alpha1.Machine) {
	one := int32(1)
	op := &v1alpha1.MachineOperation{ObjectMeta: metav1.ObjectMeta{Name: "web-repave", Generation: 1, CreationTimestamp: metav1.NewTime(t0)},
		Spec: v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationRepave,
			MachineSelector: &v1alpha1.MachineSelector{MatchLabels: map[string]string{"pool": "web"}},
			Rollout:         &v1alpha1.Rollout{MaxUnavailable: &intstr.IntOrString{IntVal: 1}, FailureBudget: &one}}}
	var ms []v1alpha1.Machine
	for _, n := range []string{"web-1", "web-2", "web-3", "web-4", "db-1"} {
		pool := strings.TrimSuffix(strings.TrimSuffix(n, "-1"), "-2")
		pool = strings.TrimRight(pool, "-1234")
		ms = append(ms, v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: n,
			Labels: map[string]string{"pool": pool, v1alpha1.LabelEnrolled: "true"}},
			Spec: v1alpha1.MachineSpec{NodeName: n}})
	}
	set := func(e v1alpha1.MachineOperationTarget) { v1alpha1.SetMachineResult(op, e, v1alpha1.CountAll) }
	set(v1alpha1.MachineOperationTarget{Name: "web-1", NodeName: "web-1", Phase: v1alpha1.OperationSucceeded, Message: "repaved a -> b",
		StartTime: at(0), CompletionTime: at(10), Steps: steps(0, "prepare", "drain", "switch", "verify", "commit")})
	set(v1alpha1.MachineOperationTarget{Name: "web-2", NodeName: "web-2", Phase: v1alpha1.OperationFailed,
		Message:   "verify: node not Ready \x1b[31m<script>alert(1)</script>",
		StartTime: at(12), CompletionTime: at(20), Steps: steps(12, "prepare", "drain", "switch", "verify", "rollback")})
	set(v1alpha1.MachineOperationTarget{Name: "web-3", NodeName: "web-3", Phase: v1alpha1.OperationWaiting, Message: "halted"})
	set(v1alpha1.MachineOperationTarget{Name: "web-3", NodeName: "intruder", Phase: v1alpha1.OperationSucceeded, Message: "forged",
		StartTime: at(1), CompletionTime: at(2)})
	return op, ms
}

func TestStatusTable(t *testing.T) {
	op, ms := fixture()
	v := Build(op, ms, t0.Add(30*time.Second))
	if v.Outcome() != Failed {
		t.Errorf("outcome %v, want Failed (halted)", v.Outcome())
	}
	var b strings.Builder
	if err := v.WriteStatus(&b); err != nil {
		t.Fatal(err)
	}
	want := `MachineOperation web-repave (Repave; rollout maxUnavailable 1, failureBudget 1)
MACHINE  PHASE      STEP                IN STEP  TOTAL  MESSAGE
web-1    Succeeded  commit              -        10.0s  repaved a -> b
web-2    Failed     rollback            -        8.0s   verify: node not Ready ?[31m<script>alert(1)</script>
web-3    Waiting    waiting for a slot  -        -      halted
web-4    -          no entry yet        -        -      
[#######xxxxxxxx---------------]  50%  2/4 finished
1 entries not counted: no Machine of that name and node that the operation targets
Outcome: Halted: 1 of 4 machines succeeded, 1 failed, 0 in progress, 2 waiting; halted on spec.rollout.failureBudget (raise it to resume, or delete the operation); 1 targets wrote no entry (their agents have not picked the operation up)
`
	if b.String() != want {
		t.Errorf("status:\n%s\nwant:\n%s", b.String(), want)
	}
}

// TestStatusInProgress: a target under way shows its step and the time in
// it; a whole success is Succeeded with the time it took.
func TestStatusInProgress(t *testing.T) {
	op := &v1alpha1.MachineOperation{ObjectMeta: metav1.ObjectMeta{Name: "one"},
		Spec: v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationNodeRestart, MachineRef: &v1alpha1.MachineReference{Name: "m"}}}
	ms := []v1alpha1.Machine{{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Spec: v1alpha1.MachineSpec{NodeName: "n"}}}
	v1alpha1.SetMachineResult(op, v1alpha1.MachineOperationTarget{Name: "m", NodeName: "n", Phase: v1alpha1.OperationInProgress,
		StartTime: at(0), Steps: steps(0, "drain")}, nil)
	v := Build(op, ms, t0.Add(95*time.Second))
	if v.Outcome() != Running {
		t.Errorf("outcome %v, want Running", v.Outcome())
	}
	if step, since := v.Rows[0].Step(); step != "after drain" || !since.Equal(t0.Add(1500*time.Millisecond)) {
		t.Errorf("step %q since %v, want after drain since its end", step, since)
	}
	var b strings.Builder
	_ = v.WriteStatus(&b)
	if !strings.Contains(b.String(), "m        InProgress  after drain  1m33s    1m35s") {
		t.Errorf("status:\n%s", b.String())
	}
	v1alpha1.SetMachineResult(op, v1alpha1.MachineOperationTarget{Name: "m", NodeName: "n", Phase: v1alpha1.OperationSucceeded,
		StartTime: at(0), CompletionTime: at(100)}, nil)
	v = Build(op, ms, t0.Add(200*time.Second))
	if v.Outcome() != Succeeded || v.Summary() != "Succeeded: 1 of 1 machines succeeded, 0 failed, 0 in progress, 0 waiting; took 1m40s" {
		t.Errorf("outcome %v, summary %q", v.Outcome(), v.Summary())
	}
	// The phase counts the entries there are: a target with none is not done.
	ms = append(ms, v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Spec: v1alpha1.MachineSpec{NodeName: "n"}})
	op.Spec = v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationNodeRestart, MachineSelector: &v1alpha1.MachineSelector{MatchLabels: map[string]string{"a": "b"}}}
	for i := range ms {
		ms[i].Name, ms[i].Spec.NodeName = fmt.Sprintf("m%d", i), fmt.Sprintf("m%d", i)
		ms[i].Labels = map[string]string{"a": "b", v1alpha1.LabelEnrolled: "true"}
	}
	op.Status = v1alpha1.MachineOperationStatus{}
	v1alpha1.SetMachineResult(op, v1alpha1.MachineOperationTarget{Name: "m0", NodeName: "m0", Phase: v1alpha1.OperationSucceeded,
		StartTime: at(0), CompletionTime: at(100)}, nil)
	if v = Build(op, ms, t0.Add(200*time.Second)); v.Status.Phase != v1alpha1.OperationSucceeded || v.Outcome() != Running ||
		!strings.HasPrefix(v.Summary(), "InProgress: 1 of 2") {
		t.Errorf("one of two targets reported Succeeded: phase %s, outcome %v, %q; want Running", v.Status.Phase, v.Outcome(), v.Summary())
	}
}

// TestStepUnderWay: a last step with no duration (a worker that records a
// step as it starts it) is the step under way.
func TestStepUnderWay(t *testing.T) {
	r := Row{Phase: v1alpha1.OperationInProgress, Start: t0, Steps: []v1alpha1.OperationStep{
		{Name: "download", StartTime: metav1.NewMicroTime(t0), DurationMilliseconds: 2000},
		{Name: "switch", StartTime: metav1.NewMicroTime(t0.Add(3 * time.Second))}}}
	if step, since := r.Step(); step != "switch" || !since.Equal(t0.Add(3*time.Second)) {
		t.Errorf("step %q since %v, want switch since its start", step, since)
	}
}
