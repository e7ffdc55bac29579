package bootstrap

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/kubeslot/kubeslot/integration/kube"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/servingcsr"
)

// The rig's kube-apiserver runs with --service-cluster-ip-range=10.0.0.0/24: its kubernetes Service is 10.0.0.1.
// The node CIDR given to the approver holds it on purpose, so that the Service CIDR rule is what refuses it.
// Node IPs 10.213.251-253.2 are outside what sdhost hands out (10.213.1-250.2), so no rig node reports them.
const (
	csrServiceCIDR = "10.0.0.0/24"
	csrServiceIP   = "10.0.0.1"
	csrNodeCIDRs   = "10.0.0.0/8"
)

// csrNode is a node identity of the rig's cluster: a client with the node's own certificate.
type csrNode struct {
	name string
	cs   kubernetes.Interface
}

// newCSRNode registers Node name as the node itself would (NodeRestriction lets a node create and update only its
// own Node) and sets its status.addresses: whatever addrs says, as a hostile node may.
func newCSRNode(t *testing.T, ctx context.Context, cp *kube.ControlPlane, admin kubernetes.Interface, name string, addrs ...corev1.NodeAddress) *csrNode {
	t.Helper()
	cert, key, err := cp.NodeClientCert(name)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cp.CertConfig(cert, key))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("node %s registers itself: %v", name, err)
	}
	// the controller manager changes a new Node too (taints, its pod CIDR): retry on a conflict
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status.Addresses = append([]corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}}, addrs...)
		_, err = cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("node %s writes its own addresses: %v", name, err)
	}
	return &csrNode{name: name, cs: cs}
}

// request files a kubelet serving CSR as the node itself, as its kubelet would (ECDSA: no key encipherment).
func (n *csrNode) request(t *testing.T, ctx context.Context, admin kubernetes.Interface, tag string, dns []string, ips ...string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:" + n.name, Organization: []string{"system:nodes"}}, DNSNames: dns}
	for _, ip := range ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	csr := &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: n.name + "-" + tag},
		Spec: certv1.CertificateSigningRequestSpec{SignerName: servingcsr.Signer,
			Usages:  []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageServerAuth},
			Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})},
	}
	t.Cleanup(func() {
		_ = admin.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), csr.Name, metav1.DeleteOptions{})
	})
	if _, err := n.cs.CertificatesV1().CertificateSigningRequests().Create(ctx, csr, metav1.CreateOptions{}); err != nil {
		t.Fatalf("node %s files %s: %v", n.name, csr.Name, err)
	}
	return csr.Name
}

// waitSigned waits (bounded) until the controller manager signed the approved request: the approver only approves
// what the kubelet-serving signer signs.
func waitSigned(t *testing.T, admin kubernetes.Interface, name string, bound time.Duration) {
	t.Helper()
	rig.Eventually(t, bound, "request "+name+" approved and signed", func() (bool, string) {
		c, err := admin.CertificatesV1().CertificateSigningRequests().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return len(c.Status.Certificate) > 0, fmt.Sprint(c.Status.Conditions)
	})
}

func csrPending(t *testing.T, ctx context.Context, admin kubernetes.Interface, name string) bool {
	t.Helper()
	c, err := admin.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return len(c.Status.Conditions) == 0
}

// TestServingCSRHostileNode: node w1, with its own real credential, lists w2's IP, the kubernetes Service IP, the
// apiserver's address and kubernetes.default.svc.cluster.local among its addresses and asks for serving certificates for each. The
// operator's approver (the CLI) leaves each pending with its reason, recorded as an Event on the request; w1's
// honest request, inside --node-cidrs, is approved and signed.
func TestServingCSRHostileNode(t *testing.T) {
	cp := rig.NeedCluster(t)
	bins := rig.NeedBins(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	admin, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	newCSRNode(t, ctx, cp, admin, "servingcsr-w2", corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "10.213.252.2"})
	w1 := newCSRNode(t, ctx, cp, admin, "servingcsr-w1",
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "10.213.251.2"},
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "10.213.252.2"},
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: csrServiceIP},
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "127.0.0.1"},
		corev1.NodeAddress{Type: corev1.NodeInternalDNS, Address: "kubernetes.default.svc.cluster.local"})
	attacks := map[string]string{
		w1.request(t, ctx, admin, "w2-ip", nil, "10.213.252.2"):                                 "IP address 10.213.252.2 is reported by another Node, servingcsr-w2",
		w1.request(t, ctx, admin, "service-ip", nil, csrServiceIP):                              "IP address 10.0.0.1 is in the Service CIDR " + csrServiceCIDR,
		w1.request(t, ctx, admin, "svc-name", []string{"kubernetes.default.svc.cluster.local"}): "under the cluster domain cluster.local",
		w1.request(t, ctx, admin, "w2-name", []string{"servingcsr-w2"}):                         `DNS name "servingcsr-w2" is reported by another Node`,
		// the rig's apiserver, as the kubeconfig names it
		w1.request(t, ctx, admin, "apiserver", nil, "127.0.0.1"): "IP address 127.0.0.1 is an apiserver address (the kubeconfig's server)",
	}
	honest := w1.request(t, ctx, admin, "honest", []string{"servingcsr-w1"}, "10.213.251.2")

	out, err := exec.CommandContext(ctx, filepath.Join(bins, "kubeslot"), "cluster", "approve-serving",
		"--kubeconfig", cp.AdminKubeconfig(), "--node", w1.name,
		"--node-cidrs", csrNodeCIDRs, "--service-cidr", csrServiceCIDR).Output()
	if err != nil {
		t.Fatalf("approve-serving: %v\n%s", err, out)
	}
	t.Logf("approve-serving:\n%s", out)
	if !strings.Contains(string(out), "approved  "+honest+" ") {
		t.Errorf("the honest request %s was not approved", honest)
	}
	waitSigned(t, admin, honest, 30*time.Second)
	for name, reason := range attacks {
		if !strings.Contains(string(out), "pending   "+name+" ") || !strings.Contains(string(out), reason) {
			t.Errorf("%s: want it pending naming %q", name, reason)
		}
		if !csrPending(t, ctx, admin, name) {
			t.Errorf("%s was approved or denied; want it pending", name)
		}
		evs, err := admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			t.Fatal(err)
		}
		if len(evs.Items) == 0 || evs.Items[0].Reason != servingcsr.EventReason || !strings.Contains(evs.Items[0].Message, reason) {
			t.Errorf("%s: events %v, want one naming %q", name, evs.Items, reason)
		}
	}
}

func mustPolicy(t *testing.T, nodeCIDRs string) servingcsr.Policy {
	t.Helper()
	p, err := servingcsr.ParsePolicy(strings.Split(nodeCIDRs, ","), []string{csrServiceCIDR}, nil, servingcsr.DefaultClusterDomain)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestServingCSRWatch: the long-running approver, with exactly the RBAC its manifests grant, approves a request
// filed while it runs within a bounded wait, leaves a hostile one pending, and stops cleanly.
func TestServingCSRWatch(t *testing.T) {
	cp := rig.NeedCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	admin, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	approver := applyApproverRBAC(t, ctx, cp, admin)
	w3 := newCSRNode(t, ctx, cp, admin, "servingcsr-w3", corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "10.213.253.2"},
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: csrServiceIP})

	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- servingcsr.Watch(wctx, approver, servingcsr.Options{Policy: mustPolicy(t, csrNodeCIDRs),
			RequestTimeout: 20 * time.Second, Resync: 5 * time.Second})
	}()
	stopped := false
	defer func() {
		if !stopped {
			stop()
			<-done
		}
	}()
	t0 := time.Now()
	good := w3.request(t, ctx, admin, "watch", []string{"servingcsr-w3"}, "10.213.253.2")
	bad := w3.request(t, ctx, admin, "watch-svc", nil, csrServiceIP)
	waitSigned(t, admin, good, 30*time.Second)
	rig.Timing(t, "servingcsr: request filed to approved and signed under --watch", time.Since(t0))
	rig.Eventually(t, 30*time.Second, "an Event on "+bad, func() (bool, string) {
		evs, err := admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + bad})
		if err != nil {
			return false, err.Error()
		}
		return len(evs.Items) > 0 && strings.Contains(evs.Items[0].Message, "Service CIDR"), fmt.Sprint(evs.Items)
	})
	if !csrPending(t, ctx, admin, bad) {
		t.Errorf("%s (the Service IP) was approved", bad)
	}
	stop()
	stopped = true
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Watch: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("Watch did not return within 10s of being stopped")
	}
}

// applyApproverRBAC creates the manifests' RBAC objects and returns a client that authenticates as their
// ServiceAccount (a client certificate for its user name: RBAC matches ServiceAccount subjects by user name).
func applyApproverRBAC(t *testing.T, ctx context.Context, cp *kube.ControlPlane, admin kubernetes.Interface) kubernetes.Interface {
	t.Helper()
	objs, err := servingcsr.Manifests("registry.example/kubeslot:test", []string{"--node-cidrs=" + csrNodeCIDRs})
	if err != nil {
		t.Fatal(err)
	}
	var user string
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.ServiceAccount:
			user = "system:serviceaccount:" + o.Namespace + ":" + o.Name
		case *rbacv1.ClusterRole:
			createOrSkip(t, o.Name, func() error {
				_, err := admin.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
				return err
			})
		case *rbacv1.ClusterRoleBinding:
			createOrSkip(t, o.Name, func() error {
				_, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
				return err
			})
		case *rbacv1.Role:
			createOrSkip(t, o.Name, func() error {
				_, err := admin.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
				return err
			})
		case *rbacv1.RoleBinding:
			createOrSkip(t, o.Name, func() error {
				_, err := admin.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
				return err
			})
		}
	}
	t.Cleanup(func() {
		bg := context.Background()
		_ = admin.RbacV1().ClusterRoleBindings().Delete(bg, "kubeslot:serving-approver", metav1.DeleteOptions{})
		_ = admin.RbacV1().ClusterRoles().Delete(bg, "kubeslot:serving-approver", metav1.DeleteOptions{})
		_ = admin.RbacV1().RoleBindings("default").Delete(bg, "kubeslot:serving-approver", metav1.DeleteOptions{})
		_ = admin.RbacV1().Roles("default").Delete(bg, "kubeslot:serving-approver", metav1.DeleteOptions{})
	})
	cert, key, err := cp.ClientCert(user, "system:serviceaccounts")
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cp.CertConfig(cert, key))
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func createOrSkip(t *testing.T, name string, create func() error) {
	t.Helper()
	if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create %s: %v", name, err)
	}
}

// TestServingCSRWatchCLI: `kubeslot cluster approve-serving --watch`, as the Deployment runs it, approves a request
// filed while it runs and exits 0 on SIGTERM.
func TestServingCSRWatchCLI(t *testing.T) {
	cp := rig.NeedCluster(t)
	bins := rig.NeedBins(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	admin, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	w4 := newCSRNode(t, ctx, cp, admin, "servingcsr-w4", corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "10.213.254.2"})
	var log strings.Builder
	cmd := exec.Command(filepath.Join(bins, "kubeslot"), "cluster", "approve-serving", "--watch", "--timeout", "20s",
		"--kubeconfig", cp.AdminKubeconfig(), "--node-cidrs", csrNodeCIDRs, "--service-cidr", csrServiceCIDR)
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	waited := false
	defer func() {
		if !waited {
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	good := w4.request(t, ctx, admin, "cli", []string{"servingcsr-w4"}, "10.213.254.2")
	waitSigned(t, admin, good, 30*time.Second)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		waited = true
		if err != nil {
			t.Errorf("approve-serving --watch after SIGTERM: %v\n%s", err, log.String())
		}
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
		waited = true
		t.Errorf("approve-serving --watch did not exit within 10s of SIGTERM\n%s", log.String())
	}
	if !strings.Contains(log.String(), "kubelet serving request approved") || !strings.Contains(log.String(), "csr="+good) {
		t.Errorf("the log does not name the approval:\n%s", log.String())
	}
}
