// Package servingcsr approves kubelet serving certificate requests
// (signer kubernetes.io/kubelet-serving) the way a cluster's approver must:
// only a request a node made for itself, for server authentication, naming
// no address the Node does not report. A kubeslot node's kubelet asks for
// its serving certificate through the cluster (serverTLSBootstrap), and
// Kubernetes ships no approver for that signer, on purpose: a node could
// otherwise claim any address. Clusters usually run an approver; this is
// the one `kubeslot cluster approve-serving` runs for clusters that do not.
//
// Imported by cmd/kubeslot and tests.
package servingcsr

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Signer is the kubelet serving certificate signer.
const Signer = certv1.KubeletServingSignerName

const nodeUserPrefix = "system:node:"

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
// made for itself and may have, else why not.
func Check(csr *certv1.CertificateSigningRequest, node *corev1.Node) error {
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
	allowed := []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageKeyEncipherment, certv1.UsageServerAuth}
	for _, u := range csr.Spec.Usages {
		if !slices.Contains(allowed, u) {
			return fmt.Errorf("usage %q is not for a serving certificate", u)
		}
	}
	if !slices.Contains(csr.Spec.Usages, certv1.UsageServerAuth) {
		return errors.New("no server auth usage")
	}
	if len(req.EmailAddresses) > 0 || len(req.URIs) > 0 {
		return errors.New("email or URI names are not for a kubelet")
	}
	if len(req.DNSNames)+len(req.IPAddresses) == 0 {
		return errors.New("no DNS name or IP address")
	}
	var names, ips []string
	for _, a := range node.Status.Addresses {
		switch a.Type {
		case corev1.NodeHostName, corev1.NodeInternalDNS, corev1.NodeExternalDNS:
			names = append(names, a.Address)
		case corev1.NodeInternalIP, corev1.NodeExternalIP:
			if ip := net.ParseIP(a.Address); ip != nil {
				ips = append(ips, ip.String())
			}
		}
	}
	for _, d := range req.DNSNames {
		if !slices.Contains(names, d) {
			return fmt.Errorf("DNS name %q is not an address of Node %s (%s)", d, node.Name, strings.Join(names, ", "))
		}
	}
	for _, ip := range req.IPAddresses {
		if !slices.Contains(ips, ip.String()) {
			return fmt.Errorf("IP address %s is not an address of Node %s (%s)", ip, node.Name, strings.Join(ips, ", "))
		}
	}
	return nil
}

// Decision is what Approve did with one pending request.
type Decision struct {
	CSR, Node string
	Approved  bool
	// Reason is why it was left pending (not approved).
	Reason string
}

// Approve looks at every pending kubelet serving request (of node only,
// when node is not "") and approves those Check accepts; the others stay
// pending for a person, with the reason in the result. Nothing is denied.
func Approve(ctx context.Context, cs kubernetes.Interface, node string, log *slog.Logger) ([]Decision, error) {
	list, err := cs.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{FieldSelector: "spec.signerName=" + Signer})
	if err != nil {
		return nil, fmt.Errorf("list certificate signing requests: %w", err)
	}
	var out []Decision
	for i := range list.Items {
		csr := &list.Items[i]
		if !pending(csr) {
			continue
		}
		n := NodeOf(csr)
		if node != "" && n != node {
			continue
		}
		d := Decision{CSR: csr.Name, Node: n}
		var nodeObj *corev1.Node
		if n != "" {
			nodeObj, err = cs.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				nodeObj, err = nil, nil
			}
			if err != nil {
				return out, fmt.Errorf("get Node %s: %w", n, err)
			}
		}
		if err := Check(csr, nodeObj); err != nil {
			d.Reason = err.Error()
			log.Info("kubelet serving request left pending", "csr", csr.Name, "node", n, "reason", d.Reason)
			out = append(out, d)
			continue
		}
		csr.Status.Conditions = append(csr.Status.Conditions, certv1.CertificateSigningRequestCondition{
			Type: certv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "KubeslotServingApproved",
			Message: "the node asked for itself, for its own addresses (kubeslot cluster approve-serving)",
		})
		if _, err := cs.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
			return out, fmt.Errorf("approve %s: %w", csr.Name, err)
		}
		d.Approved = true
		log.Info("kubelet serving request approved", "csr", csr.Name, "node", n)
		out = append(out, d)
	}
	return out, nil
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
