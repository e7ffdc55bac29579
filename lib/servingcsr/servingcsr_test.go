package servingcsr

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"net/netip"
	"strings"
	"testing"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// testNode reports 10.213.<n>.2 and its name, and whatever else it is given:
// a node writes its own status.addresses, so a hostile one lists anything.
func testNode(name string, extra ...string) *corev1.Node {
	ip := map[string]string{"w1": "10.213.1.2", "w2": "10.213.2.2"}[name]
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}}}}
	for _, a := range extra {
		typ := corev1.NodeInternalDNS
		if _, err := netip.ParseAddr(a); err == nil {
			typ = corev1.NodeInternalIP
		}
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: typ, Address: a})
	}
	return n
}

// testPolicy's node CIDR holds the Service CIDR and the apiserver on
// purpose, so that those rules are what refuses them.
func testPolicy(t *testing.T) Policy {
	t.Helper()
	p, err := ParsePolicy([]string{"10.0.0.0/8"}, []string{DefaultServiceCIDR}, []string{"nodes.example.com"}, DefaultClusterDomain)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// testCluster: w2 at 10.213.2.2, the apiserver at 10.213.0.10 and api.example.com.
func testCluster() Cluster {
	return Cluster{
		Others:    map[string]string{"w2": "w2", "10.213.2.2": "w2"},
		APIServer: map[string]string{"10.213.0.10": "Endpoints default/kubernetes", "api.nodes.example.com": "the kubeconfig's server"},
	}
}

type ruleCase struct {
	name   string
	csr    *certv1.CertificateSigningRequest
	node   *corev1.Node // w1, listing the request's SANs among its own addresses
	policy Policy
	want   string
}

// ruleCases are requests w1 makes for addresses it lists itself, each
// refused by one rule only.
func ruleCases(t *testing.T) []ruleCase {
	w1 := func(name string, dns, ips []string, usages ...certv1.KeyUsage) (*certv1.CertificateSigningRequest, *corev1.Node) {
		return request(t, name, "system:node:w1", "system:node:w1", dns, ips, usages...), testNode("w1", append(dns, ips...)...)
	}
	p := testPolicy(t)
	var cs []ruleCase
	add := func(name, want string, pol Policy, dns, ips []string, usages ...certv1.KeyUsage) {
		csr, n := w1(name, dns, ips, usages...)
		cs = append(cs, ruleCase{name, csr, n, pol, want})
	}
	add("another node's IP", "IP address 10.213.2.2 is reported by another Node, w2", p, nil, []string{"10.213.2.2"})
	add("another node's name", `DNS name "w2" is reported by another Node, w2`, p, []string{"w2"}, nil)
	add("the kubernetes Service IP", "IP address 10.96.0.1 is in the Service CIDR 10.96.0.0/12", p, nil, []string{"10.96.0.1"})
	add("an apiserver endpoint", "IP address 10.213.0.10 is an apiserver address (Endpoints default/kubernetes)", p, nil, []string{"10.213.0.10"})
	add("the kubeconfig's server name", `DNS name "api.nodes.example.com" is an apiserver address`, p, []string{"api.nodes.example.com"}, nil)
	add("outside the node CIDRs", "IP address 192.0.2.9 is outside --node-cidrs 10.0.0.0/8", p, nil, []string{"192.0.2.9"})
	add("no node CIDRs given", "no --node-cidrs given", Policy{ClusterDomain: DefaultClusterDomain}, nil, []string{"10.213.1.2"})
	add("loopback", "IP address 127.0.0.1 is loopback", Policy{NodeCIDRs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}, nil, []string{"127.0.0.1"})
	add("under the cluster domain", `DNS name "x.nodes.example.com.cluster.local" is under the cluster domain cluster.local`, p, []string{"x.nodes.example.com.cluster.local"}, nil)
	add("kubernetes.default.svc.cluster.local", "under the cluster domain", p, []string{"kubernetes.default.svc.cluster.local"}, nil)
	add("kubernetes.default.svc", `DNS name "kubernetes.default.svc" names a Service`, p, []string{"kubernetes.default.svc"}, nil)
	add("a .svc. name under a suffix", "names a Service", p, []string{"api.svc.nodes.example.com"}, nil)
	add("kubernetes", `DNS name "kubernetes" is a name of the apiserver's Service`, p, []string{"kubernetes"}, nil)
	add("kubernetes.default", "is a name of the apiserver's Service", p, []string{"kubernetes.default"}, nil)
	add("a name under no suffix", `DNS name "api.example.org" is not the node's name nor under --dns-suffix nodes.example.com`, p, []string{"api.example.org"}, nil)
	add("a name and no suffixes", "no --dns-suffix is given", Policy{ClusterDomain: DefaultClusterDomain}, []string{"w1.example.org"}, nil)
	add("a wildcard", "wildcard", p, []string{"*.nodes.example.com"}, nil)
	add("no digital signature", "no digital signature usage", p, []string{"w1"}, nil, certv1.UsageServerAuth)
	add("key encipherment, no digital signature", "no digital signature usage", p, []string{"w1"}, nil, certv1.UsageKeyEncipherment, certv1.UsageServerAuth)
	ipName := testNode("w1")
	ipName.Status.Addresses = append(ipName.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalDNS, Address: "10.213.1.2"})
	cs = append(cs, ruleCase{"an IP as a DNS name", request(t, "x", "system:node:w1", "system:node:w1", []string{"10.213.1.2"}, nil), ipName, p,
		`DNS name "10.213.1.2" is an IP address written as a DNS name`})
	return cs
}

// TestCheckRules: each request names only addresses w1 reports for itself,
// and each breaks one rule beyond that.
func TestCheckRules(t *testing.T) {
	for _, c := range ruleCases(t) {
		err := Check(c.csr, c.node, c.policy, testCluster())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %q", c.name, err, c.want)
		}
	}
}

// TestCheckGood: what an honest kubelet asks for is approved, with or
// without key encipherment (RSA keys), duplicates and all.
func TestCheckGood(t *testing.T) {
	p := testPolicy(t)
	for _, us := range [][]certv1.KeyUsage{
		{certv1.UsageDigitalSignature, certv1.UsageServerAuth},
		{certv1.UsageKeyEncipherment, certv1.UsageDigitalSignature, certv1.UsageServerAuth},
		{certv1.UsageServerAuth, certv1.UsageDigitalSignature, certv1.UsageServerAuth},
	} {
		csr := request(t, "ok", "system:node:w1", "system:node:w1", []string{"w1", "W1.Nodes.Example.com"}, []string{"10.213.1.2"}, us...)
		if err := Check(csr, testNode("w1", "w1.nodes.example.com"), p, testCluster()); err != nil {
			t.Errorf("usages %v: own request refused: %v", us, err)
		}
	}
}

// TestCheckShape: another requester, subject, signer, usage, or names the
// signer never signs.
func TestCheckShape(t *testing.T) {
	n, p, c := testNode("w1"), testPolicy(t), testCluster()
	cases := map[string]struct {
		csr  *certv1.CertificateSigningRequest
		want string
	}{
		"address it does not report": {request(t, "x", "system:node:w1", "system:node:w1", nil, []string{"10.213.9.2"}), "IP address 10.213.9.2 is not an address of Node w1"},
		"name it does not report":    {request(t, "x", "system:node:w1", "system:node:w1", []string{"w1.nodes.example.com"}, nil), "is not an address of Node w1"},
		"asked by another":           {request(t, "x", "system:node:w2", "system:node:w1", []string{"w1"}, nil), `requested by "system:node:w2"`},
		"asked by a user":            {request(t, "x", "alice", "system:node:w1", []string{"w1"}, nil), `requested by "alice"`},
		"subject of another":         {request(t, "x", "system:node:w1", "system:node:w2", []string{"w1"}, nil), "subject"},
		"client usage":               {request(t, "x", "system:node:w1", "system:node:w1", []string{"w1"}, nil, certv1.UsageDigitalSignature, certv1.UsageServerAuth, certv1.UsageClientAuth), `usage "client auth"`},
		"no server auth":             {request(t, "x", "system:node:w1", "system:node:w1", []string{"w1"}, nil, certv1.UsageDigitalSignature, certv1.UsageKeyEncipherment), "no server auth"},
		"no names":                   {request(t, "x", "system:node:w1", "system:node:w1", nil, nil), "no DNS name"},
	}
	for name, c2 := range cases {
		if err := Check(c2.csr, n, p, c); err == nil || !strings.Contains(err.Error(), c2.want) {
			t.Errorf("%s: %v, want an error naming %q", name, err, c2.want)
		}
	}
	other := request(t, "x", "system:node:w1", "system:node:w1", []string{"w1"}, nil)
	other.Spec.SignerName = certv1.KubeAPIServerClientKubeletSignerName
	if err := Check(other, n, p, c); err == nil || !strings.Contains(err.Error(), "signer") {
		t.Errorf("client signer: %v", err)
	}
	if err := Check(request(t, "x", "system:node:w1", "system:node:w1", []string{"w1"}, nil), nil, p, c); err == nil {
		t.Error("approved for a Node that does not exist")
	}
}

// TestCheckAllReasons: every broken rule is named, not just the first.
func TestCheckAllReasons(t *testing.T) {
	csr := request(t, "x", "system:node:w1", "system:node:w1", []string{"kubernetes.default.svc.cluster.local"}, []string{"10.213.2.2", "10.96.0.1"})
	err := Check(csr, testNode("w1", "kubernetes.default.svc.cluster.local", "10.213.2.2", "10.96.0.1"), testPolicy(t), testCluster())
	for _, want := range []string{"cluster domain", "another Node, w2", "Service CIDR"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v: want it to name %q", err, want)
		}
	}
}

func TestParsePolicy(t *testing.T) {
	p, err := ParsePolicy([]string{"10.213.0.0/16", " fd00::/64"}, []string{"10.96.0.0/12"}, []string{".Nodes.Example.com."}, "Cluster.Local.")
	if err != nil {
		t.Fatal(err)
	}
	if len(p.NodeCIDRs) != 2 || p.DNSSuffixes[0] != "nodes.example.com" || p.ClusterDomain != "cluster.local" {
		t.Errorf("policy %+v", p)
	}
	for _, c := range []struct {
		nodes, svc, dns []string
		domain, want    string
	}{
		{[]string{"10.213.0.0"}, nil, nil, "cluster.local", `--node-cidrs "10.213.0.0"`},
		{nil, []string{"nope"}, nil, "cluster.local", `--service-cidr "nope"`},
		{nil, nil, []string{"com"}, "cluster.local", `--dns-suffix "com"`},
		{nil, nil, []string{"*.example.com"}, "cluster.local", `--dns-suffix "*.example.com"`},
		{nil, nil, []string{"x.cluster.local"}, "cluster.local", `--dns-suffix "x.cluster.local" is under --cluster-domain`},
		{nil, nil, nil, "", "--cluster-domain"},
	} {
		if _, err := ParsePolicy(c.nodes, c.svc, c.dns, c.domain); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %q", c, err, c.want)
		}
	}
}
