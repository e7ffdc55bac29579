package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/cli/clitest"
	"github.com/kubeslot/kubeslot/lib/exitcode"
)

// rolloutServer serves one selector operation over two Machines, one
// succeeded and one in the given phase, as an apiserver would.
func rolloutServer(t *testing.T, second v1alpha1.OperationPhase) string {
	t.Helper()
	one := int32(1)
	op := &v1alpha1.MachineOperation{TypeMeta: metav1.TypeMeta{APIVersion: "kubeslot.dev/v1alpha1", Kind: "MachineOperation"},
		ObjectMeta: metav1.ObjectMeta{Name: "web-repave"},
		Spec: v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationRepave,
			MachineSelector: &v1alpha1.MachineSelector{MatchLabels: map[string]string{"pool": "web"}},
			Rollout:         &v1alpha1.Rollout{FailureBudget: &one}}}
	ms := &v1alpha1.MachineList{TypeMeta: metav1.TypeMeta{APIVersion: "kubeslot.dev/v1alpha1", Kind: "MachineList"}}
	start := metav1.NewTime(time.Now().Add(-time.Minute))
	for i, n := range []string{"web-1", "web-2", "web-3"} {
		ms.Items = append(ms.Items, v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: n,
			Labels: map[string]string{"pool": "web", v1alpha1.LabelEnrolled: "true"}}, Spec: v1alpha1.MachineSpec{NodeName: n}})
		phase := v1alpha1.OperationSucceeded
		if i > 0 {
			phase = second
		}
		e := v1alpha1.MachineOperationTarget{Name: n, NodeName: n, Phase: phase, StartTime: &start}
		if phase.Finished() {
			e.CompletionTime = &start
		}
		v1alpha1.SetMachineResult(op, e, v1alpha1.CountAll)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		var body any
		switch r.URL.Path {
		case "/apis/kubeslot.dev/v1alpha1/machineoperations/web-repave":
			body = op
		case "/apis/kubeslot.dev/v1alpha1/machines":
			if sel := r.URL.Query().Get("labelSelector"); sel != "kubeslot.dev/enrolled=true,pool=web" {
				t.Errorf("Machines listed with selector %q", sel)
			}
			body = ms
		default:
			w.WriteHeader(http.StatusNotFound)
			body = map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}
		}
		_ = json.NewEncoder(w).Encode(body)
	}))
	t.Cleanup(srv.Close)
	return kubeconfigFor(t, srv.URL)
}

// TestRolloutStatusAndReport: the status names every target and the
// outcome, exiting 1 on a failure (a halt) and 0 on success; the report
// is written to the file asked for.
func TestRolloutStatusAndReport(t *testing.T) {
	kc := rolloutServer(t, v1alpha1.OperationFailed)
	code, out, errs := clitest.Call(run, "", "rollout", "status", "web-repave", "--kubeconfig", kc, "--timeout", "10s")
	if code != exitcode.Failure || !strings.Contains(out, "Outcome: Failed: 1 of 3 machines succeeded, 2 failed") {
		t.Errorf("status of a failed rollout: exit %d\n%s\n%s", code, out, errs)
	}
	for _, m := range []string{"web-1", "web-2", "web-3"} {
		if !strings.Contains(out, m) {
			t.Errorf("status does not name %s:\n%s", m, out)
		}
	}
	kc = rolloutServer(t, v1alpha1.OperationSucceeded)
	if code, out, errs := clitest.Call(run, "", "rollout", "status", "web-repave", "--watch", "--kubeconfig", kc, "--timeout", "10s"); code != exitcode.OK ||
		!strings.Contains(out, "Outcome: Succeeded: 3 of 3") {
		t.Errorf("status --watch of a finished rollout: exit %d\n%s\n%s", code, out, errs)
	}
	file := filepath.Join(t.TempDir(), "report.html")
	code, out, errs = clitest.Call(run, "", "rollout", "report", "web-repave", "--html", file, "--kubeconfig", kc, "--timeout", "10s")
	b, err := os.ReadFile(file)
	if code != exitcode.OK || err != nil || !strings.Contains(string(b), `data-machine="web-3"`) || !strings.Contains(out, "Succeeded") {
		t.Errorf("report: exit %d, %v\n%s\n%s", code, err, out, errs)
	}
	if code, _, errs := clitest.Call(run, "", "rollout", "report", "web-repave", "--kubeconfig", kc); code != exitcode.Usage || !strings.Contains(errs, "--html") {
		t.Errorf("report without --html: exit %d\n%s", code, errs)
	}
}
