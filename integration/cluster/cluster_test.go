package cluster

// Tests of the rig's control plane itself (integration/kube): that it serves the API, and that the identities it
// hands out authenticate as who they claim and are authorized like their real counterparts.

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubeslot/kubeslot/integration/kube"
	"github.com/kubeslot/kubeslot/integration/rig"
)

func clientFor(t *testing.T, cfg *rest.Config) *kubernetes.Clientset {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// whoAmI asks the apiserver how it authenticated cfg.
func whoAmI(t *testing.T, ctx context.Context, cfg *rest.Config) authnv1.UserInfo {
	t.Helper()
	r, err := clientFor(t, cfg).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectReview: %v", err)
	}
	return r.Status.UserInfo
}

func TestClusterAdminCreatesConfigMap(t *testing.T) {
	cp := rig.NeedCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	admin := clientFor(t, cp.AdminConfig())
	name := fmt.Sprintf("rig-check-%d", os.Getpid())
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"slot": "a"}}
	if _, err := admin.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ConfigMap: %v", err)
	}
	t.Cleanup(func() {
		_ = admin.CoreV1().ConfigMaps("default").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	got, err := admin.CoreV1().ConfigMaps("default").Get(ctx, name, metav1.GetOptions{})
	if err != nil || got.Data["slot"] != "a" {
		t.Fatalf("get ConfigMap: %v, data %v", err, got.Data)
	}

	// The kubeconfig file and a token kubeconfig work too (what kubectl or an agent would be given).
	fromFile, err := clientcmd.BuildConfigFromFlags("", cp.AdminKubeconfig())
	if err != nil {
		t.Fatalf("admin kubeconfig %s: %v", cp.AdminKubeconfig(), err)
	}
	if _, err := clientFor(t, fromFile).CoreV1().ConfigMaps("default").Get(ctx, name, metav1.GetOptions{}); err != nil {
		t.Fatalf("get with the admin kubeconfig file: %v", err)
	}
	tok, err := cp.TokenFor("admin", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	fromBytes, err := clientcmd.RESTConfigFromKubeConfig(cp.Kubeconfig("admin", tok))
	if err != nil {
		t.Fatal(err)
	}
	if u := whoAmI(t, ctx, fromBytes); u.Username != "admin" || !slices.Contains(u.Groups, "system:masters") {
		t.Fatalf("admin token kubeconfig authenticated as %+v", u)
	}
}

// A node identity (client certificate CN=system:node:N, O=system:nodes, or the static token of system:node:N) is
// held to what the Node authorizer gives a kubelet: it reads Nodes but cannot list Secrets.
func TestClusterNodeIdentity(t *testing.T) {
	cp := rig.NeedCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	admin := clientFor(t, cp.AdminConfig())
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-3"}}
	if _, err := admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Node node-3: %v", err)
	}
	t.Cleanup(func() { _ = admin.CoreV1().Nodes().Delete(context.Background(), "node-3", metav1.DeleteOptions{}) })

	cert, key, err := cp.NodeClientCert("node-3")
	if err != nil {
		t.Fatal(err)
	}
	tok, err := cp.TokenFor("system:node:node-3", "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]*rest.Config{"client cert": cp.CertConfig(cert, key), "static token": cp.TokenConfig(tok)} {
		t.Run(name, func(t *testing.T) {
			if u := whoAmI(t, ctx, cfg); u.Username != "system:node:node-3" || !slices.Contains(u.Groups, "system:nodes") {
				t.Fatalf("authenticated as %+v", u)
			}
			nc := clientFor(t, cfg)
			if _, err := nc.CoreV1().Nodes().Get(ctx, "node-3", metav1.GetOptions{}); err != nil {
				t.Errorf("node gets its own Node: %v", err)
			}
			_, err := nc.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{})
			if !apierrors.IsForbidden(err) {
				t.Errorf("node lists Secrets: err %v, want 403 Forbidden", err)
			}
		})
	}
}

func TestClusterBootstrapToken(t *testing.T) {
	cp := rig.NeedCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	tok, err := cp.CreateBootstrapToken(ctx, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	id := tok[:6]
	u := whoAmI(t, ctx, cp.TokenConfig(tok))
	if u.Username != "system:bootstrap:"+id {
		t.Errorf("bootstrap token authenticated as user %q, want system:bootstrap:%s", u.Username, id)
	}
	for _, g := range []string{"system:bootstrappers", kube.BootstrapGroup} {
		if !slices.Contains(u.Groups, g) {
			t.Errorf("bootstrap token groups %v lack %s", u.Groups, g)
		}
	}
	_, err = clientFor(t, cp.TokenConfig(tok)).CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("bootstrap token lists Secrets: err %v, want 403 Forbidden", err)
	}
	// A wrong secret for the same id is refused.
	bad := cp.TokenConfig(id + ".0000000000000000")
	_, err = clientFor(t, bad).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if !apierrors.IsUnauthorized(err) {
		t.Errorf("wrong token secret: err %v, want 401 Unauthorized", err)
	}
}

func TestClusterAgentTokensAndLookups(t *testing.T) {
	cp := rig.NeedCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	tok, err := cp.TokenFor("agent-0")
	if err != nil {
		t.Fatal(err)
	}
	if u := whoAmI(t, ctx, cp.TokenConfig(tok)); u.Username != "agent-0" || !slices.Contains(u.Groups, kube.AgentGroup) {
		t.Errorf("agent-0 authenticated as %+v", u)
	}
	if _, err := clientFor(t, cp.TokenConfig(tok)).CoreV1().Nodes().List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("agent-0 (no role bound) lists Nodes: err %v, want 403", err)
	}
	if _, err := cp.TokenFor("agent-0", "system:masters"); err == nil {
		t.Error("TokenFor agent-0 with the wrong groups succeeded")
	}
	if _, err := cp.TokenFor("nobody"); err == nil {
		t.Error("TokenFor an unknown user succeeded")
	}
}
