// Package servingcsr approves kubelet serving certificate requests
// (signer kubernetes.io/kubelet-serving) the way a cluster's approver must
// when one node may be hostile: only a request a node made for itself, for
// server authentication, naming addresses the operator placed nodes in and
// no other node, Service or apiserver can be reached at. A kubeslot node's
// kubelet asks for its serving certificate through the cluster
// (serverTLSBootstrap), and Kubernetes ships no approver for that signer, on
// purpose: a node writes its own status.addresses, so it could otherwise
// claim any address. This is the approver `kubeslot cluster approve-serving`
// runs, once or as a long-running watch (manifests.yaml deploys it).
//
// Nothing is ever denied: a request that fails a rule stays pending for a
// person, with the reason logged and recorded as an Event on the request.
//
// Imported by cmd/kubeslot and tests.
package servingcsr

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
)

// Signer is the kubelet serving certificate signer.
const Signer = certv1.KubeletServingSignerName

const nodeUserPrefix = "system:node:"

// DefaultServiceCIDR and DefaultClusterDomain are kube-apiserver's and
// kubeadm's defaults.
const (
	DefaultServiceCIDR   = "10.96.0.0/12"
	DefaultClusterDomain = "cluster.local"
)

// Policy is what the operator allows. The zero Policy approves no IP
// address and only the node's own name as a DNS name.
type Policy struct {
	// NodeCIDRs are the ranges node addresses live in; an IP SAN outside
	// all of them is refused, so with none no IP SAN is ever approved.
	NodeCIDRs []netip.Prefix
	// ServiceCIDRs hold Service cluster IPs; an IP SAN inside is refused
	// (a serving certificate for 10.96.0.1 would pass as the apiserver).
	ServiceCIDRs []netip.Prefix
	// DNSSuffixes: a DNS SAN other than the node's name must be under one.
	DNSSuffixes []string
	// ClusterDomain: no DNS SAN may be it or under it.
	ClusterDomain string
}

// ParsePolicy builds a Policy from the approve-serving flags' values.
func ParsePolicy(nodeCIDRs, serviceCIDRs, dnsSuffixes []string, clusterDomain string) (Policy, error) {
	var p Policy
	var err error
	if p.NodeCIDRs, err = parsePrefixes("--node-cidrs", nodeCIDRs); err != nil {
		return p, err
	}
	if p.ServiceCIDRs, err = parsePrefixes("--service-cidr", serviceCIDRs); err != nil {
		return p, err
	}
	for _, s := range dnsSuffixes {
		n := strings.TrimPrefix(normName(s), ".")
		if n == "" || strings.Contains(n, "*") || !strings.Contains(n, ".") {
			return p, fmt.Errorf("--dns-suffix %q: want a domain with at least two labels, e.g. nodes.example.com", s)
		}
		p.DNSSuffixes = append(p.DNSSuffixes, n)
	}
	p.ClusterDomain = normName(clusterDomain)
	if p.ClusterDomain == "" {
		return p, fmt.Errorf("--cluster-domain %q: must not be empty", clusterDomain)
	}
	for _, s := range p.DNSSuffixes {
		if underDomain(s, p.ClusterDomain) {
			return p, fmt.Errorf("--dns-suffix %q is under --cluster-domain %q", s, p.ClusterDomain)
		}
	}
	return p, nil
}

func parsePrefixes(flag string, vals []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, v := range vals {
		v = strings.TrimSpace(v)
		if v == "" {
			continue
		}
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w", flag, v, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// Cluster is what the approver read from the cluster just before it
// decides: addresses it must never put in a node's certificate.
type Cluster struct {
	// Others maps an address (an IP in netip form, or a lower-case DNS
	// name, Node names included) to the other Node that reports it.
	Others map[string]string
	// APIServer maps an address the apiserver is reached at to where the
	// approver saw it (the kubernetes Endpoints, the kubeconfig).
	APIServer map[string]string
}

// NodeOf returns the node a request claims to come from ("" when its
// requester is not a node identity).
func NodeOf(csr *certv1.CertificateSigningRequest) string {
	name, ok := strings.CutPrefix(csr.Spec.Username, nodeUserPrefix)
	if !ok || !slices.Contains(csr.Spec.Groups, "system:nodes") {
		return ""
	}
	return name
}

// Check returns nil when csr is a serving certificate request that node
// made for itself and may have under p, given what c says about the rest
// of the cluster; else every reason why not.
func Check(csr *certv1.CertificateSigningRequest, node *corev1.Node, p Policy, c Cluster) error {
	if csr.Spec.SignerName != Signer {
		return fmt.Errorf("signer %q, not %s", csr.Spec.SignerName, Signer)
	}
	if n := NodeOf(csr); n == "" || node == nil || n != node.Name {
		return fmt.Errorf("requested by %q, not by the node it is for", csr.Spec.Username)
	}
	blk, _ := pem.Decode(csr.Spec.Request)
	if blk == nil || blk.Type != "CERTIFICATE REQUEST" {
		return errors.New("the request is not a PEM CERTIFICATE REQUEST")
	}
	req, err := x509.ParseCertificateRequest(blk.Bytes)
	if err != nil {
		return fmt.Errorf("the request does not parse: %w", err)
	}
	if err := req.CheckSignature(); err != nil {
		return fmt.Errorf("the request's signature: %w", err)
	}
	if req.Subject.CommonName != nodeUserPrefix+node.Name || !slices.Equal(req.Subject.Organization, []string{"system:nodes"}) {
		return fmt.Errorf("subject %q, want CN=%s%s, O=system:nodes", req.Subject.String(), nodeUserPrefix, node.Name)
	}
	if err := checkUsages(csr.Spec.Usages); err != nil {
		return err
	}
	if len(req.EmailAddresses) > 0 || len(req.URIs) > 0 {
		return errors.New("email or URI names are not for a kubelet")
	}
	if len(req.DNSNames)+len(req.IPAddresses) == 0 {
		return errors.New("no DNS name or IP address")
	}
	names, ips := ownAddresses(node)
	var errs []error
	for _, d := range req.DNSNames {
		errs = append(errs, checkName(d, node, names, p, c)...)
	}
	for _, raw := range req.IPAddresses {
		ip, ok := netip.AddrFromSlice(raw)
		if !ok {
			errs = append(errs, fmt.Errorf("IP address %v does not parse", raw))
			continue
		}
		errs = append(errs, checkIP(ip.Unmap(), node, ips, p, c)...)
	}
	return errors.Join(errs...)
}

// checkUsages holds the usages to what the kubelet-serving signer signs:
// as a set, exactly {digital signature, server auth} or those and key
// encipherment. Anything else would be approved and then never signed.
func checkUsages(us []certv1.KeyUsage) error {
	set := map[certv1.KeyUsage]bool{}
	for _, u := range us {
		switch u {
		case certv1.UsageDigitalSignature, certv1.UsageKeyEncipherment, certv1.UsageServerAuth:
			set[u] = true
		default:
			return fmt.Errorf("usage %q is not for a kubelet serving certificate", u)
		}
	}
	if !set[certv1.UsageServerAuth] {
		return errors.New("no server auth usage")
	}
	if !set[certv1.UsageDigitalSignature] {
		return errors.New("no digital signature usage (the kubelet-serving signer requires it)")
	}
	return nil
}

// ownAddresses are the names and IPs the Node reports for itself.
func ownAddresses(node *corev1.Node) (names []string, ips []netip.Addr) {
	for _, a := range node.Status.Addresses {
		switch a.Type {
		case corev1.NodeHostName, corev1.NodeInternalDNS, corev1.NodeExternalDNS:
			names = append(names, normName(a.Address))
		case corev1.NodeInternalIP, corev1.NodeExternalIP:
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				ips = append(ips, ip.Unmap())
			}
		}
	}
	return names, ips
}

func checkIP(ip netip.Addr, node *corev1.Node, own []netip.Addr, p Policy, c Cluster) []error {
	var errs []error
	if !slices.Contains(own, ip) {
		errs = append(errs, fmt.Errorf("IP address %s is not an address of Node %s", ip, node.Name))
	}
	if other, ok := c.Others[ip.String()]; ok {
		errs = append(errs, fmt.Errorf("IP address %s is reported by another Node, %s", ip, other))
	}
	if ip.IsLoopback() || ip.IsUnspecified() || ip.IsMulticast() || ip.IsLinkLocalUnicast() {
		errs = append(errs, fmt.Errorf("IP address %s is loopback, unspecified, multicast or link-local", ip))
	}
	for _, s := range p.ServiceCIDRs {
		if s.Contains(ip) {
			errs = append(errs, fmt.Errorf("IP address %s is in the Service CIDR %s (--service-cidr)", ip, s))
		}
	}
	if where, ok := c.APIServer[ip.String()]; ok {
		errs = append(errs, fmt.Errorf("IP address %s is an apiserver address (%s)", ip, where))
	}
	switch {
	case len(p.NodeCIDRs) == 0:
		errs = append(errs, fmt.Errorf("IP address %s: no --node-cidrs given, so no IP address is approved", ip))
	case !slices.ContainsFunc(p.NodeCIDRs, func(n netip.Prefix) bool { return n.Contains(ip) }):
		errs = append(errs, fmt.Errorf("IP address %s is outside --node-cidrs %s", ip, joinPrefixes(p.NodeCIDRs)))
	}
	return errs
}

func checkName(raw string, node *corev1.Node, own []string, p Policy, c Cluster) []error {
	d := normName(raw)
	var errs []error
	if !slices.Contains(own, d) {
		errs = append(errs, fmt.Errorf("DNS name %q is not an address of Node %s", raw, node.Name))
	}
	if other, ok := c.Others[d]; ok {
		errs = append(errs, fmt.Errorf("DNS name %q is reported by another Node, %s", raw, other))
	}
	if why := reservedName(d, p.ClusterDomain); why != "" {
		errs = append(errs, fmt.Errorf("DNS name %q %s", raw, why))
	}
	if where, ok := c.APIServer[d]; ok {
		errs = append(errs, fmt.Errorf("DNS name %q is an apiserver address (%s)", raw, where))
	}
	if d != normName(node.Name) && !slices.ContainsFunc(p.DNSSuffixes, func(s string) bool { return underDomain(d, s) }) {
		if len(p.DNSSuffixes) == 0 {
			errs = append(errs, fmt.Errorf("DNS name %q is not the node's name and no --dns-suffix is given", raw))
		} else {
			errs = append(errs, fmt.Errorf("DNS name %q is not the node's name nor under --dns-suffix %s", raw, strings.Join(p.DNSSuffixes, ",")))
		}
	}
	return errs
}

// reservedName says why d names something in the cluster rather than a
// node ("" when it does not): the apiserver's in-cluster names and
// anything a Service or Pod is reached at.
func reservedName(d, clusterDomain string) string {
	switch {
	case d == "" || strings.Contains(d, "*"):
		return "is empty or a wildcard"
	case isIP(d):
		// a node may have chosen an IP as its name; some clients match an
		// IP against DNS names too
		return "is an IP address written as a DNS name"
	case clusterDomain != "" && (d == clusterDomain || underDomain(d, clusterDomain)):
		return fmt.Sprintf("is under the cluster domain %s (--cluster-domain)", clusterDomain)
	case strings.HasSuffix(d, ".svc") || strings.Contains(d, ".svc."):
		return "names a Service (.svc)"
	case d == "kubernetes" || d == "kubernetes.default" || strings.HasPrefix(d, "kubernetes.default."):
		return "is a name of the apiserver's Service"
	case d == "localhost" || strings.HasSuffix(d, ".localhost"):
		return "is localhost"
	}
	return ""
}

func isIP(s string) bool {
	_, err := netip.ParseAddr(s)
	return err == nil
}

// normName is a DNS name as compared: lower case, no trailing dot.
func normName(s string) string {
	return strings.TrimSuffix(strings.ToLower(strings.TrimSpace(s)), ".")
}

// underDomain: name is a strict subdomain of domain (both normalised).
func underDomain(name, domain string) bool {
	return strings.HasSuffix(name, "."+strings.TrimPrefix(domain, "."))
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// pending: neither approved nor denied nor failed.
func pending(csr *certv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == certv1.CertificateApproved || c.Type == certv1.CertificateDenied || c.Type == certv1.CertificateFailed {
			return false
		}
	}
	return true
}
