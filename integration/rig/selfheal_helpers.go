package rig

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubeslot/kubeslot/integration/machineapi"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// ForTest is the rig with its failures reported to t (a subtest): the rig's helpers call t.Fatalf, which must run
// on the goroutine of the test that calls them.
func (r *RepaveRig) ForTest(t *testing.T) *RepaveRig {
	b := *r.Rig
	b.t = t
	return &RepaveRig{&b}
}

// Sh runs a shell script in the host, failing the test with its output.
func (r *RepaveRig) Sh(ctx context.Context, script string) string {
	r.t.Helper()
	out, err := r.H.Run(ctx, "sh", "-c", script)
	if err != nil {
		r.t.Fatalf("%s: %v\n%s", script, err, out)
	}
	return string(out)
}

// JournalCount counts the lines of unit's journal that contain every one of subs.
func (r *RepaveRig) JournalCount(ctx context.Context, unit string, subs ...string) int {
	j, _ := r.H.Journal(ctx, unit)
	n := 0
	for _, l := range strings.Split(j, "\n") {
		if ContainsAll(l, subs) {
			n++
		}
	}
	return n
}

// DenyStatusWrites makes the apiserver refuse every write of the Machine status by the rig's node (its own
// identity, as the watcher writes it): a ValidatingAdmissionPolicy and its binding, in force when it returns. The
// returned function removes them and waits until the node may write again. message is the refusal's text.
func (r *RepaveRig) DenyStatusWrites(ctx context.Context, message string) (remove func()) {
	t := r.t
	t.Helper()
	name := "rig-deny-status-" + r.Node
	forbidden := metav1.StatusReasonForbidden
	fail := admv1.Fail
	pol := &admv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: admv1.ValidatingAdmissionPolicySpec{
		FailurePolicy: &fail,
		MatchConstraints: &admv1.MatchResources{ResourceRules: []admv1.NamedRuleWithOperations{{RuleWithOperations: admv1.RuleWithOperations{
			Operations: []admv1.OperationType{admv1.Update},
			Rule:       admv1.Rule{APIGroups: []string{v1alpha1.SchemeGroupVersion.Group}, APIVersions: []string{"*"}, Resources: []string{v1alpha1.MachinesResource + "/status"}},
		}}}},
		MatchConditions: []admv1.MatchCondition{{Name: "rig-node", Expression: fmt.Sprintf("request.userInfo.username == 'system:node:%s'", r.Node)}},
		Validations:     []admv1.Validation{{Expression: "false", Message: message, Reason: &forbidden}},
	}}
	bind := &admv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: admv1.ValidatingAdmissionPolicyBindingSpec{
		PolicyName: name, ValidationActions: []admv1.ValidationAction{admv1.Deny}}}
	api := r.Admin.AdmissionregistrationV1()
	if _, err := api.ValidatingAdmissionPolicies().Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := api.ValidatingAdmissionPolicyBindings().Create(ctx, bind, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	del := func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = api.ValidatingAdmissionPolicyBindings().Delete(dctx, name, metav1.DeleteOptions{})
		_ = api.ValidatingAdmissionPolicies().Delete(dctx, name, metav1.DeleteOptions{})
	}
	t.Cleanup(del)
	// A dry-run write as the node tells when the policy is in force, and when it is gone.
	cert, key, err := r.CP.NodeClientCert(r.Node)
	if err != nil {
		t.Fatal(err)
	}
	agent, err := machineapi.New(r.CP.CertConfig(cert, key))
	if err != nil {
		t.Fatal(err)
	}
	probe := func() error {
		return agent.REST().Patch(types.MergePatchType).Resource(v1alpha1.MachinesResource).Name(r.Node).SubResource("status").
			Param("dryRun", "All").Body([]byte(`{"status":{"agentVersion":"rig-probe"}}`)).Do(ctx).Error()
	}
	Eventually(t, time.Minute, "the status-denying policy in force", func() (bool, string) {
		err := probe()
		return err != nil && strings.Contains(err.Error(), message), fmt.Sprint(err)
	})
	return func() {
		t.Helper()
		del()
		Eventually(t, time.Minute, "the status-denying policy gone", func() (bool, string) {
			err := probe()
			return err == nil, fmt.Sprint(err)
		})
	}
}

// PatchMachine merge-patches the rig's Machine (subresource "" or "status") as the cluster admin.
func (r *RepaveRig) PatchMachine(ctx context.Context, subresource, patch string) {
	r.t.Helper()
	req := r.MC.REST().Patch(types.MergePatchType).Resource(v1alpha1.MachinesResource).Name(r.Node)
	if subresource != "" {
		req = req.SubResource(subresource)
	}
	if err := req.Body([]byte(patch)).Do(ctx).Error(); err != nil {
		r.t.Fatalf("patch Machine %s %s: %v", r.Node, subresource, err)
	}
}

// NudgeWatcher touches the Machine (an annotation), as tools do: the watcher decides again at once.
func (r *RepaveRig) NudgeWatcher(ctx context.Context) {
	r.t.Helper()
	r.PatchMachine(ctx, "", fmt.Sprintf(`{"metadata":{"annotations":{"kubeslot.dev/rig-nudge":%q}}}`, time.Now().UTC().Format(time.RFC3339Nano)))
}
