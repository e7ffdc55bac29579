package rollout

// A rollout you can watch: the conditions `kubectl wait` reads, and the real `kubeslot rollout status` and
// `rollout report` against the rig's apiserver, checked on the paced rollouts of rollout_fleet_test.go.

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// watched is the result of a `kubeslot rollout status --watch` run.
type watched struct {
	out  string
	code int
}

// watchStatus builds the CLI and runs `kubeslot rollout status op --watch` in the background as soon as the
// operation exists; the run ends with the rollout, or with the test.
func (h *roHarness) watchStatus(op string) <-chan watched {
	h.bin = rig.BuildKubeslot(h.t)
	ch := make(chan watched, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	done := make(chan struct{})
	h.t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if _, err := h.admin.GetOperation(ctx, op); err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		out, _, code := rig.RunCLI(h.t, ctx, h.cp, h.bin, "rollout", "status", op, "--watch", "--timeout", "3m")
		ch <- watched{out, code}
	}()
	return ch
}

// checkWatchable checks what a person watching op sees: the condition cond True on the operation, `kubeslot
// rollout status` (and, when given, the --watch run that followed it live) naming every target and ending with
// outcome and exit code want, and `rollout report --html` drawing a timeline row per target.
func (h *roHarness) checkWatchable(name string, op *v1alpha1.MachineOperation, cond string, want int, outcome string, live <-chan watched) {
	t := h.t
	t.Helper()
	c := apimeta.FindStatusCondition(op.Status.Conditions, cond)
	if c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("condition %s: %+v, want True (conditions %+v)", cond, c, op.Status.Conditions)
	}
	if h.bin == "" {
		h.bin = rig.BuildKubeslot(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	check := func(what, out string, code int) {
		t.Helper()
		if code != want || !strings.Contains(out, outcome) {
			t.Errorf("%s: exit %d, want %d and %q:\n%s", what, code, want, outcome, out)
		}
		for _, a := range h.agents {
			if !strings.Contains(out, a.name) {
				t.Errorf("%s does not name target %s:\n%s", what, a.name, out)
			}
		}
	}
	if cond == v1alpha1.OpConditionComplete {
		// What README shows: kubectl itself waits on the condition.
		kubectl := exec.CommandContext(ctx, filepath.Join(rig.KubeBinDir, "kubectl"), "--kubeconfig", h.cp.AdminKubeconfig(),
			"wait", "--for=condition=Complete", "machineoperation/"+name, "--timeout=20s")
		kubectl.Env = append(os.Environ(), "HOME="+t.TempDir()) // its discovery cache, not the machine's
		if b, err := kubectl.CombinedOutput(); err != nil {
			t.Errorf("kubectl wait --for=condition=Complete: %v\n%s", err, b)
		}
	}
	out, _, code := rig.RunCLI(t, ctx, h.cp, h.bin, "rollout", "status", name)
	check("rollout status", out, code)
	if live != nil {
		select {
		case w := <-live:
			check("rollout status --watch", w.out, w.code)
		case <-ctx.Done():
			t.Error("rollout status --watch did not end with the rollout")
		}
	}
	file := filepath.Join(t.TempDir(), name+".html")
	if _, _, code := rig.RunCLI(t, ctx, h.cp, h.bin, "rollout", "report", name, "--html", file); code != 0 {
		t.Errorf("rollout report: exit %d", code)
	}
	page, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range h.agents {
		if !strings.Contains(string(page), `data-machine="`+a.name+`"`) {
			t.Errorf("report has no timeline row for %s", a.name)
		}
	}
	if !strings.Contains(string(page), strings.TrimPrefix(outcome, "Outcome: ")) || !strings.Contains(string(page), `class="step"`) {
		t.Errorf("report lacks the outcome %q or the steps the agents published", outcome)
	}
}

// checkRealSteps: a rollout of real repaves is Complete, and each entry carries its repaver's steps, the
// disruptive ones included, for `rollout status` and the report's timeline.
func checkRealSteps(t *testing.T, op *v1alpha1.MachineOperation) {
	t.Helper()
	if c := apimeta.FindStatusCondition(op.Status.Conditions, v1alpha1.OpConditionComplete); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("condition Complete: %+v, want True", c)
	}
	for _, e := range op.Status.Machines {
		var names []string
		for _, s := range e.Steps {
			names = append(names, s.Name)
		}
		got := strings.Join(names, ",")
		if !strings.Contains(got, "drain,switch,start,verify,commit") {
			t.Errorf("%s: steps %q, want the repave's drain to commit in order", e.Name, got)
		}
	}
}
