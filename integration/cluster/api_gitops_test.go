package cluster

// The GitOps path: the checked-in kustomize base deploy/, applied with kubectl instead of `kubeslot cluster install`.

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/kubeslot/kubeslot/integration/kube"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/clusterinstall"
)

// TestClusterApplyKustomizeBase: `kubectl apply -k deploy/` on a cluster without kubeslot's API gives the same
// objects as `kubeslot cluster install`, and the API works: an enrolled node registers its Machine, and the admission
// policy refuses it another node's. The cluster is left as cluster install made it.
func TestClusterApplyKustomizeBase(t *testing.T) {
	cp := rig.NeedAPI(t)
	ctx := rig.APICtx(t)
	kubectl := rigKubectl(t)
	base, err := kube.RepoFile("deploy/" + clusterinstall.KustomizationFile)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := dynamic.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	objs, err := clusterinstall.Objects()
	if err != nil {
		t.Fatal(err)
	}
	installed := liveObjects(t, ctx, dc, objs)

	reinstall := func(ctx context.Context) error {
		if _, err := clusterinstall.Uninstall(ctx, cp.AdminConfig(), rig.APILog(t), clusterinstall.UninstallOptions{DeleteObjects: true}); err != nil {
			return err
		}
		if _, err := clusterinstall.Install(ctx, cp.AdminConfig(), rig.APILog(t)); err != nil {
			return err
		}
		return rig.WaitTargetPolicy(ctx, cp)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := reinstall(ctx); err != nil {
			t.Errorf("put back what cluster install makes: %v", err)
		}
	})
	if _, err := clusterinstall.Uninstall(ctx, cp.AdminConfig(), rig.APILog(t), clusterinstall.UninstallOptions{DeleteObjects: true}); err != nil {
		t.Fatal(err)
	}

	t0 := time.Now()
	runKubectl(t, ctx, kubectl, cp, "apply", "-k", filepath.Dir(base))
	applied := liveObjects(t, ctx, dc, objs)
	for i, o := range objs {
		if !reflect.DeepEqual(applied[i], installed[i]) {
			t.Errorf("%s %s: kubectl apply -k gave\n%v\ncluster install gave\n%v", o.GetKind(), o.GetName(), applied[i], installed[i])
		}
	}

	// The API works as installed: an enrolled node registers its own Machine (once the CRD is served) ...
	const node = "gitops-node"
	agent := rig.NodeAPI(t, cp, node)
	rig.Eventually(t, time.Minute, "the enrolled node registers its Machine", func() (bool, string) {
		_, err := agent.CreateMachine(ctx, rig.NodeMachine(node, node))
		return err == nil || apierrors.IsAlreadyExists(err), errString(err)
	})
	// ... and not another node's (once the apiserver enforces the policy kubectl applied).
	took := rig.Eventually(t, time.Minute, "the policy refuses another node's Machine", func() (bool, string) {
		_, err := agent.CreateMachine(ctx, rig.NodeMachine(node+"-other", node+"-other"))
		if err == nil {
			_ = rig.AdminAPI(t, cp).DeleteMachine(ctx, node+"-other")
		}
		return err != nil && strings.Contains(err.Error(), "may create only its own Machine"), errString(err)
	})
	t.Logf("timing: kubectl apply -k to an enforced API %.1fs (policy in force %.1fs after the Machine)",
		time.Since(t0).Seconds(), took.Seconds())
}

// rigKubectl is the kubectl scripts/kube-bins.sh built next to the rig's binaries, else one on PATH.
func rigKubectl(t *testing.T) string {
	t.Helper()
	if dir, err := kube.CachedBinDir(); err == nil {
		if p := filepath.Join(dir, "kubectl"); fileExists(p) {
			return p
		}
	}
	p, err := exec.LookPath("kubectl")
	if err != nil {
		if rig.Required {
			t.Fatalf("KUBESLOT_REQUIRE_RIG=1 and no kubectl (scripts/kube-bins.sh kubectl builds one): %v", err)
		}
		t.Skipf("no kubectl: %v", err)
	}
	return p
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}

// gitopsResources are the resources of the kinds clusterinstall applies (all cluster-scoped).
var gitopsResources = map[string]schema.GroupVersionResource{
	"CustomResourceDefinition":         {Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"},
	"ClusterRole":                      {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"},
	"ClusterRoleBinding":               {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"},
	"ValidatingAdmissionPolicy":        {Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicies"},
	"ValidatingAdmissionPolicyBinding": {Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicybindings"},
}

// liveObjects reads each object from the apiserver without what differs between two applies of the same manifest:
// identity, versions, timestamps, field managers, status and kubectl's last-applied annotation.
func liveObjects(t *testing.T, ctx context.Context, dc dynamic.Interface, objs []*unstructured.Unstructured) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, o := range objs {
		gvr, ok := gitopsResources[o.GetKind()]
		if !ok {
			t.Fatalf("%s %s: kind not known to the test", o.GetKind(), o.GetName())
		}
		live, err := dc.Resource(gvr).Get(ctx, o.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
		}
		for _, f := range []string{"uid", "resourceVersion", "generation", "creationTimestamp", "managedFields"} {
			unstructured.RemoveNestedField(live.Object, "metadata", f)
		}
		unstructured.RemoveNestedField(live.Object, "metadata", "annotations", "kubectl.kubernetes.io/last-applied-configuration")
		if a, _, _ := unstructured.NestedMap(live.Object, "metadata", "annotations"); len(a) == 0 {
			unstructured.RemoveNestedField(live.Object, "metadata", "annotations")
		}
		unstructured.RemoveNestedField(live.Object, "status")
		out = append(out, live.Object)
	}
	return out
}
