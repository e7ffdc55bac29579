package servingcsr

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func request(t *testing.T, name, user, cn string, dns []string, ips []string, usages ...certv1.KeyUsage) *certv1.CertificateSigningRequest {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn, Organization: []string{"system:nodes"}}, DNSNames: dns}
	for _, ip := range ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	if usages == nil {
		usages = []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageServerAuth}
	}
	return &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certv1.CertificateSigningRequestSpec{SignerName: Signer, Username: user, Groups: []string{"system:nodes", "system:authenticated"},
			Usages: usages, Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})},
	}
}

func testNode(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "10.213.1.2"}, {Type: corev1.NodeHostName, Address: name}}}}
}

// TestCheck: a node's request for its own addresses passes; another node's
// name or address, a client usage, a foreign signer or subject do not.
func TestCheck(t *testing.T) {
	n := testNode("w1")
	ok := request(t, "ok", "system:node:w1", "system:node:w1", []string{"w1"}, []string{"10.213.1.2"})
	if err := Check(ok, n); err != nil {
		t.Fatalf("own request refused: %v", err)
	}
	cases := map[string]struct {
		csr  *certv1.CertificateSigningRequest
		want string
	}{
		"other node's address": {request(t, "x", "system:node:w1", "system:node:w1", nil, []string{"10.213.1.3"}), "IP address 10.213.1.3"},
		"other DNS name":       {request(t, "x", "system:node:w1", "system:node:w1", []string{"api.example"}, nil), `DNS name "api.example"`},
		"asked by another":     {request(t, "x", "system:node:w2", "system:node:w1", []string{"w1"}, nil), `requested by "system:node:w2"`},
		"asked by a user":      {request(t, "x", "alice", "system:node:w1", []string{"w1"}, nil), `requested by "alice"`},
		"subject of another":   {request(t, "x", "system:node:w1", "system:node:w2", []string{"w1"}, nil), "subject"},
		"client usage":         {request(t, "x", "system:node:w1", "system:node:w1", []string{"w1"}, nil, certv1.UsageClientAuth), "usage"},
		"no names":             {request(t, "x", "system:node:w1", "system:node:w1", nil, nil), "no DNS name"},
	}
	other := request(t, "x", "system:node:w1", "system:node:w1", []string{"w1"}, nil)
	other.Spec.SignerName = certv1.KubeAPIServerClientKubeletSignerName
	cases["client signer"] = struct {
		csr  *certv1.CertificateSigningRequest
		want string
	}{other, "signer"}
	for name, c := range cases {
		if err := Check(c.csr, n); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %q", name, err, c.want)
		}
	}
	if err := Check(ok, nil); err == nil {
		t.Error("approved for a Node that does not exist")
	}
}

// TestApprove: pending requests that pass are approved, the others stay
// pending with their reason; approved ones and other nodes' are left alone.
func TestApprove(t *testing.T) {
	good := request(t, "good", "system:node:w1", "system:node:w1", []string{"w1"}, []string{"10.213.1.2"})
	bad := request(t, "bad", "system:node:w1", "system:node:w1", nil, []string{"192.0.2.9"})
	w2 := request(t, "w2", "system:node:w2", "system:node:w2", []string{"w2"}, nil)
	cs := fake.NewClientset(testNode("w1"), testNode("w2"), good, bad, w2)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ds, err := Approve(t.Context(), cs, "w1", log)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Decision{}
	for _, d := range ds {
		got[d.CSR] = d
	}
	if len(ds) != 2 || !got["good"].Approved || got["bad"].Approved || !strings.Contains(got["bad"].Reason, "192.0.2.9") {
		t.Errorf("decisions %+v", ds)
	}
	c, err := cs.CertificatesV1().CertificateSigningRequests().Get(t.Context(), "good", metav1.GetOptions{})
	if err != nil || pending(c) {
		t.Errorf("good request not approved: %+v %v", c.Status, err)
	}
}
