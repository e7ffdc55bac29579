package servingcsr

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// TestManifests: the embedded YAML decodes into the typed objects the
// approver needs, with the operator's image and flags, and grants what
// Watch does and no more.
func TestManifests(t *testing.T) {
	objs, err := Manifests("registry.example/kubeslot:v1", []string{"--node-cidrs=10.213.0.0/16", "--dns-suffix=nodes.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	var sa *corev1.ServiceAccount
	var dep *appsv1.Deployment
	var cr *rbacv1.ClusterRole
	var role *rbacv1.Role
	var crb *rbacv1.ClusterRoleBinding
	var rb *rbacv1.RoleBinding
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.ServiceAccount:
			sa = o
		case *appsv1.Deployment:
			dep = o
		case *rbacv1.ClusterRole:
			cr = o
		case *rbacv1.Role:
			role = o
		case *rbacv1.ClusterRoleBinding:
			crb = o
		case *rbacv1.RoleBinding:
			rb = o
		default:
			t.Errorf("unexpected object %T", o)
		}
	}
	if sa == nil || dep == nil || cr == nil || role == nil || crb == nil || rb == nil {
		t.Fatalf("objects %v", objs)
	}
	c := dep.Spec.Template.Spec.Containers[0]
	wantArgs := []string{"cluster", "approve-serving", "--watch", "--node-cidrs=10.213.0.0/16", "--dns-suffix=nodes.example.com"}
	if c.Image != "registry.example/kubeslot:v1" || !slices.Equal(c.Args, wantArgs) {
		t.Errorf("container image %q args %q", c.Image, c.Args)
	}
	if dep.Spec.Template.Spec.ServiceAccountName != sa.Name || dep.Namespace != sa.Namespace {
		t.Errorf("Deployment runs as %s/%s, ServiceAccount is %s/%s", dep.Namespace, dep.Spec.Template.Spec.ServiceAccountName, sa.Namespace, sa.Name)
	}
	for _, s := range append(crb.Subjects, rb.Subjects...) {
		if s.Kind != "ServiceAccount" || s.Name != sa.Name || s.Namespace != sa.Namespace {
			t.Errorf("binding subject %+v", s)
		}
	}
	if crb.RoleRef.Name != cr.Name || rb.RoleRef.Name != role.Name || rb.Namespace != "default" {
		t.Errorf("bindings %+v %+v", crb.RoleRef, rb.RoleRef)
	}
	grants := func(rules []rbacv1.PolicyRule, group, resource, verb, name string) bool {
		return slices.ContainsFunc(rules, func(r rbacv1.PolicyRule) bool {
			return slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) &&
				(name == "" && len(r.ResourceNames) == 0 || slices.Equal(r.ResourceNames, []string{name}))
		})
	}
	for _, g := range []struct{ group, resource, verb, name string }{
		{"certificates.k8s.io", "certificatesigningrequests", "watch", ""},
		{"certificates.k8s.io", "certificatesigningrequests/approval", "update", ""},
		{"certificates.k8s.io", "signers", "approve", Signer},
		{"", "nodes", "list", ""},
		{"", "nodes", "watch", ""},
	} {
		if !grants(cr.Rules, g.group, g.resource, g.verb, g.name) {
			t.Errorf("ClusterRole does not grant %+v", g)
		}
	}
	for _, g := range []struct{ group, resource, verb, name string }{
		{"", "endpoints", "get", "kubernetes"},
		{"discovery.k8s.io", "endpointslices", "list", ""},
		{"", "events", "create", ""},
	} {
		if !grants(role.Rules, g.group, g.resource, g.verb, g.name) {
			t.Errorf("Role does not grant %+v", g)
		}
	}
	for _, r := range append(cr.Rules, role.Rules...) {
		if slices.Contains(r.Verbs, "*") || slices.Contains(r.Resources, "*") || slices.Contains(r.Verbs, "delete") {
			t.Errorf("rule grants too much: %+v", r)
		}
	}
	if grants(cr.Rules, "certificates.k8s.io", "signers", "approve", "") || grants(cr.Rules, "certificates.k8s.io", "certificatesigningrequests/approval", "delete", "") {
		t.Error("ClusterRole may approve for every signer")
	}
}

func TestManifestsRefuse(t *testing.T) {
	for _, c := range []struct {
		image string
		flags []string
		want  string
	}{
		{"", nil, "image"},
		{"a b", nil, "image"},
		{"img", []string{"node-cidrs=10.0.0.0/8"}, "approver flag"},
	} {
		if _, err := ManifestsYAML(c.image, c.flags); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v", c, err)
		}
	}
}
