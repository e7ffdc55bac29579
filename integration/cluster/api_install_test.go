package cluster

// Tests of `kubeslot cluster install|uninstall` (lib/clusterinstall and the CLI) against the rig's real
// kube-apiserver, and of what kubectl shows of the API.

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeslot/kubeslot/integration/kube"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/clusterinstall"
)

// TestAPIKubectlPrinterColumns: kubectl shows the printer columns of both kinds.
func TestAPIKubectlPrinterColumns(t *testing.T) {
	cp := rig.NeedAPI(t)
	ctx := rig.APICtx(t)
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		if rig.Required {
			t.Fatalf("KUBESLOT_REQUIRE_RIG=1 and kubectl is not installed: %v", err)
		}
		t.Skipf("kubectl not installed: %v", err)
	}
	admin := rig.AdminAPI(t, cp)
	if _, err := admin.CreateMachine(ctx, rig.SampleMachine("api-kubectl", "api-kubectl")); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.UpdateMachineStatus(ctx, "api-kubectl", func(m *v1alpha1.Machine) error {
		m.Status = v1alpha1.MachineStatus{Phase: v1alpha1.MachineReady, ActiveSlot: "b", AgentVersion: "v9.9.9",
			Applied: &v1alpha1.AppliedConfig{KubernetesVersion: "1.37.1"}}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	op := rig.SampleOperation("api-kubectl-op", v1alpha1.OperationRepave)
	op.Spec.MachineRef.Name = "api-kubectl"
	if _, err := admin.CreateOperation(ctx, op); err != nil {
		t.Fatal(err)
	}
	out := runKubectl(t, ctx, kubectl, cp, "get", "machines", "api-kubectl")
	wantColumns(t, out, []string{"NAME", "NODE", "SLOT", "KUBERNETES", "AGENT", "PHASE", "AGE"},
		[]string{"api-kubectl", "api-kubectl", "b", "1.37.1", "v9.9.9", "Ready"})
	out = runKubectl(t, ctx, kubectl, cp, "get", "machineoperations", "api-kubectl-op")
	wantColumns(t, out, []string{"NAME", "TYPE", "MACHINE", "PHASE", "DONE", "INPROGRESS", "WAITING", "FAILED", "STARTED", "AGE"},
		[]string{"api-kubectl-op", "Repave", "api-kubectl"})
	out = runKubectl(t, ctx, kubectl, cp, "get", "machines", "api-kubectl", "-o", "wide")
	wantColumns(t, out, []string{"NAME", "NODE", "SLOT", "KUBERNETES", "AGENT", "PHASE", "AGE", "DESIRED", "PAUSED"},
		[]string{"api-kubectl", "1.37.1", "1.37.2", "true"})
	out = runKubectl(t, ctx, kubectl, cp, "get", "machines,machineoperations")
	if !strings.Contains(out, "machine.kubeslot.dev/api-kubectl") || !strings.Contains(out, "machineoperation.kubeslot.dev/api-kubectl-op") {
		t.Errorf("kubectl get machines,machineoperations does not list both:\n%s", out)
	}
	// the short names (ksm, not Cluster API's "ma")
	out = runKubectl(t, ctx, kubectl, cp, "get", "ksm,mop")
	if !strings.Contains(out, "machine.kubeslot.dev/api-kubectl") || !strings.Contains(out, "machineoperation.kubeslot.dev/api-kubectl-op") {
		t.Errorf("kubectl get ksm,mop does not list both:\n%s", out)
	}
}

func runKubectl(t *testing.T, ctx context.Context, kubectl string, cp *kube.ControlPlane, args ...string) string {
	t.Helper()
	args = append([]string{"--kubeconfig", cp.AdminKubeconfig(), "--cache-dir", t.TempDir()}, args...)
	out, err := exec.CommandContext(ctx, kubectl, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("kubectl %s:\n%s", strings.Join(args[4:], " "), out)
	return string(out)
}

func wantColumns(t *testing.T, out string, header, values []string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 2 {
		t.Errorf("kubectl printed no rows:\n%s", out)
		return
	}
	if got := strings.Fields(lines[0]); strings.Join(got, " ") != strings.Join(header, " ") {
		t.Errorf("columns %q, want %q", got, header)
	}
	row := " " + strings.Join(strings.Fields(lines[1]), " ") + " "
	for _, v := range values {
		if !strings.Contains(row, " "+v+" ") {
			t.Errorf("row %q lacks %q", lines[1], v)
		}
	}
}

// TestClusterInstallIdempotent: installing again, with the library or the CLI, changes nothing and says so.
func TestClusterInstallIdempotent(t *testing.T) {
	cp := rig.NeedAPI(t)
	ctx := rig.APICtx(t)
	rep, err := clusterinstall.Install(ctx, cp.AdminConfig(), rig.APILog(t))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := clusterinstall.Objects()
	if err != nil {
		t.Fatal(err)
	}
	if rep.Changed() || len(rep.Changes) != len(objs) {
		t.Errorf("second install: %+v, want %d objects, all unchanged", rep.Changes, len(objs))
	}
	for _, c := range rep.Changes {
		if c.Action != clusterinstall.Unchanged {
			t.Errorf("second install: %s %s %s", c.Kind, c.Name, c.Action)
		}
	}
	bin := rig.BuildKubeslot(t)
	stdout, _, code := rig.RunCLI(t, ctx, cp, bin, "cluster", "install")
	if code != 0 || !strings.Contains(stdout, "customresourcedefinition/machines.kubeslot.dev unchanged") ||
		!strings.Contains(stdout, "Nothing changed") || strings.Contains(stdout, " created") || strings.Contains(stdout, " updated") {
		t.Errorf("kubeslot cluster install, again: exit %d\n%s", code, stdout)
	}
	// --kubeconfig wins over $KUBECONFIG
	_, stderr, code := rig.RunCLI(t, ctx, cp, bin, "cluster", "install", "--kubeconfig", filepath.Join(t.TempDir(), "missing"))
	if code != 2 || !strings.Contains(stderr, "kubeconfig") {
		t.Errorf("a missing --kubeconfig: exit %d, want 2 and a message naming the kubeconfig:\n%s", code, stderr)
	}
}

// TestClusterUninstall removes the API (refusing first while objects exist) and installs it again for whatever runs
// after it.
func TestClusterUninstall(t *testing.T) {
	cp := rig.NeedAPI(t)
	ctx := rig.APICtx(t)
	admin := rig.AdminAPI(t, cp)
	if _, err := admin.CreateMachine(ctx, rig.SampleMachine("api-uninstall", "api-uninstall")); err != nil {
		t.Fatal(err)
	}

	bin := rig.BuildKubeslot(t)
	_, stderr, code := rig.RunCLI(t, ctx, cp, bin, "cluster", "uninstall")
	if code != 1 || !strings.Contains(stderr, "would be deleted with their CRDs") {
		t.Errorf("uninstall with Machines present: exit %d, want 1 and a refusal:\n%s", code, stderr)
	}
	if _, err := admin.GetMachine(ctx, "api-uninstall"); err != nil {
		t.Fatalf("the refused uninstall deleted something: %v", err)
	}

	objs, err := clusterinstall.Objects()
	if err != nil {
		t.Fatal(err)
	}
	stdout, _, code := rig.RunCLI(t, ctx, cp, bin, "cluster", "uninstall", "--delete-objects")
	if code != 0 || strings.Count(stdout, " deleted\n") != len(objs) {
		t.Errorf("uninstall --delete-objects: exit %d, want 0 and %d objects deleted:\n%s", code, len(objs), stdout)
	}
	cs, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.GetMachine(ctx, "api-uninstall"); !apierrors.IsNotFound(err) {
		t.Errorf("Machines still served after uninstall: %v", err)
	}
	if _, err := cs.RbacV1().ClusterRoles().Get(ctx, "kubeslot:agent", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ClusterRole kubeslot:agent after uninstall: %v", err)
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, "kubeslot-agent-writes", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("policy kubeslot-agent-writes after uninstall: %v", err)
	}

	rep, err := clusterinstall.Uninstall(ctx, cp.AdminConfig(), rig.APILog(t), clusterinstall.UninstallOptions{})
	if err != nil || rep.Changed() {
		t.Errorf("uninstall again: %+v, %v; want nothing to do", rep.Changes, err)
	}

	rep, err = clusterinstall.Install(ctx, cp.AdminConfig(), rig.APILog(t))
	if err != nil {
		t.Fatalf("reinstall: %v", err)
	}
	for _, c := range rep.Changes {
		if c.Action != clusterinstall.Created {
			t.Errorf("reinstall: %s %s %s, want created", c.Kind, c.Name, c.Action)
		}
	}
	if err := rig.WaitTargetPolicy(ctx, cp); err != nil {
		t.Fatal(err)
	}
}
