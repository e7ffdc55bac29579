package v1alpha1

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestAccessControlManifests(t *testing.T) {
	objs, err := AccessControl()
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, o := range objs {
		order = append(order, o.GetKind()+"/"+o.GetName())
	}
	want := []string{
		"ValidatingAdmissionPolicy/kubeslot-agent-writes", "ValidatingAdmissionPolicyBinding/kubeslot-agent-writes",
		"ValidatingAdmissionPolicy/kubeslot-agent-operation-targets", "ValidatingAdmissionPolicyBinding/kubeslot-agent-operation-targets",
		"ValidatingAdmissionPolicy/kubeslot-agent-rollout-leases", "ValidatingAdmissionPolicyBinding/kubeslot-agent-rollout-leases",
		"ClusterRole/kubeslot:agent", "ClusterRole/kubeslot:fleet-member", "ClusterRoleBinding/kubeslot:agent",
	}
	if !slices.Equal(order, want) {
		t.Fatalf("access control, in apply order:\n got %q\nwant %q (policies before the grant they limit)", order, want)
	}
	byName := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		byName[o.GetKind()+"/"+o.GetName()] = o
	}

	// Every node: read only (and list budgets, for the drain's preflight). An enrolled node (kubeslot:fleet-member, bound per node by kubeslot cluster enroll):
	// create its Machine, write status, delete operations (ttlSecondsAfterFinished, narrowed by the policies below),
	// take rollout slots; never change the objects themselves, never delete a Machine, never write a RolloutStop.
	grants := func(role string) map[string][]string {
		rules, _, _ := unstructured.NestedSlice(byName["ClusterRole/"+role].Object, "rules")
		granted := map[string][]string{}
		for _, r := range rules {
			m := r.(map[string]any)
			groups, _ := m["apiGroups"].([]any)
			if len(groups) != 1 || (groups[0] != GroupName && groups[0] != "policy") {
				t.Errorf("%s: rule outside %s (and policy, for the drain's read of budgets): %v", role, GroupName, m)
			}
			for _, res := range m["resources"].([]any) {
				if groups[0] == "policy" && res != "poddisruptionbudgets" {
					t.Errorf("%s: a grant of policy/%v", role, res)
				}
				for _, v := range m["verbs"].([]any) {
					granted[res.(string)] = append(granted[res.(string)], v.(string))
				}
			}
		}
		return granted
	}
	for role, wantGrants := range map[string]map[string][]string{
		"kubeslot:agent": {
			"machines":                 {"get", "list", "watch"},
			"machines/status":          {"get"},
			"machineoperations":        {"get", "list", "watch"},
			"machineoperations/status": {"get"},
			"rolloutleases":            {"get", "list"},
			"poddisruptionbudgets":     {"list"},
			"rolloutstops":             {"get", "list", "watch"},
		},
		"kubeslot:fleet-member": {
			"machines":                 {"create"},
			"machines/status":          {"get", "update", "patch"},
			"machineoperations":        {"delete"},
			"machineoperations/status": {"get", "update", "patch"},
			"rolloutleases":            {"get", "list", "create", "update", "delete"},
		},
	} {
		granted := grants(role)
		for res, verbs := range wantGrants {
			if !slices.Equal(granted[res], verbs) {
				t.Errorf("%s may %v %s, want exactly %v", role, granted[res], res, verbs)
			}
		}
		if len(granted) != len(wantGrants) {
			t.Errorf("%s is granted %v", role, granted)
		}
	}
	for _, o := range objs {
		if o.GetKind() == "ClusterRoleBinding" && o.GetName() != "kubeslot:agent" {
			t.Errorf("a manifest binds %s: only enrollment binds a node to the fleet role", o.GetName())
		}
	}
	subjects, _, _ := unstructured.NestedSlice(byName["ClusterRoleBinding/kubeslot:agent"].Object, "subjects")
	if len(subjects) != 1 || subjects[0].(map[string]any)["name"] != NodesGroup {
		t.Errorf("the agent role is bound to %v, want only group %s", subjects, NodesGroup)
	}

	for _, name := range []string{"kubeslot-agent-writes", "kubeslot-agent-operation-targets", "kubeslot-agent-rollout-leases"} {
		p := byName["ValidatingAdmissionPolicy/"+name]
		if fp, _, _ := unstructured.NestedString(p.Object, "spec", "failurePolicy"); fp != "Fail" {
			t.Errorf("%s: failurePolicy %q, want Fail", name, fp)
		}
		b := byName["ValidatingAdmissionPolicyBinding/"+name]
		actions, _, _ := unstructured.NestedStringSlice(b.Object, "spec", "validationActions")
		policy, _, _ := unstructured.NestedString(b.Object, "spec", "policyName")
		if !slices.Equal(actions, []string{"Deny"}) || policy != name {
			t.Errorf("binding %s: policy %q, actions %v; want %s, [Deny]", name, policy, actions, name)
		}
		conds, _, _ := unstructured.NestedSlice(p.Object, "spec", "matchConditions")
		if len(conds) != 1 || !strings.Contains(conds[0].(map[string]any)["expression"].(string), NodeUserPrefix) {
			t.Errorf("%s: matchConditions %v do not scope it to node identities", name, conds)
		}
	}
	kind, _, _ := unstructured.NestedString(byName["ValidatingAdmissionPolicy/kubeslot-agent-operation-targets"].Object, "spec", "paramKind", "kind")
	if kind != "Machine" {
		t.Errorf("operation-targets policy paramKind %q, want Machine", kind)
	}

	// The delete RBAC grants is narrowed by both policies: each must see DELETE of machineoperations, and check the
	// TTL, the phase and the node's own entry (writes) and the Machines named (targets).
	for name, wantExprs := range map[string][]string{
		"kubeslot-agent-writes": {"has(oldObject.spec.ttlSecondsAfterFinished)", "['Succeeded', 'Failed']",
			"oldObject.?status.?completionTime.hasValue()", "size(variables.deleteMine) > 0"},
		"kubeslot-agent-operation-targets": {"!variables.deleteNames || params.spec.nodeName == variables.node"},
	} {
		p := byName["ValidatingAdmissionPolicy/"+name]
		if !matchesDelete(p, "machineoperations") {
			t.Errorf("%s: its matchConstraints do not cover DELETE of machineoperations", name)
		}
		vals, _, _ := unstructured.NestedSlice(p.Object, "spec", "validations")
		var exprs []string
		for _, v := range vals {
			exprs = append(exprs, v.(map[string]any)["expression"].(string))
		}
		all := strings.Join(exprs, "\n")
		for _, w := range wantExprs {
			if !strings.Contains(all, w) {
				t.Errorf("%s: no validation contains %q", name, w)
			}
		}
	}
}

// matchesDelete reports whether policy p's resource rules cover DELETE of resource.
func matchesDelete(p *unstructured.Unstructured, resource string) bool {
	rules, _, _ := unstructured.NestedSlice(p.Object, "spec", "matchConstraints", "resourceRules")
	for _, r := range rules {
		m := r.(map[string]any)
		ops, _, _ := unstructured.NestedStringSlice(m, "operations")
		res, _, _ := unstructured.NestedStringSlice(m, "resources")
		if slices.Contains(ops, "DELETE") && slices.Contains(res, resource) {
			return true
		}
	}
	return false
}

func TestDecodeManifests(t *testing.T) {
	objs, err := DecodeManifests("x.yaml", []byte("---\n# only a comment\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\n"))
	if err != nil || len(objs) != 1 || objs[0].GetName() != "a" {
		t.Errorf("DecodeManifests = %v, %v; want one ConfigMap a", objs, err)
	}
	for _, bad := range []string{"apiVersion: v1\nkind: ConfigMap\n", "kind: [\n", "apiVersion: v1\nmetadata:\n  name: a\n"} {
		if _, err := DecodeManifests("bad.yaml", []byte(bad)); err == nil || !strings.Contains(err.Error(), "bad.yaml: document 1") {
			t.Errorf("DecodeManifests(%q) = %v, want an error naming bad.yaml, document 1", bad, err)
		}
	}
}
