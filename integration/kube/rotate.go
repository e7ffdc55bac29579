package kube

// Short-lived client certificates, for tests of certificate rotation and
// expiry: the rig's other certificates are valid for a year.

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"time"
)

// ClientCertUntil issues a client certificate for user in groups that the
// apiserver accepts until notAfter. It is valid from an hour back, like
// every rig certificate, so clock skew between a node and the apiserver
// cannot make it "not yet valid"; notAfter must be later than that.
func (c *ControlPlane) ClientCertUntil(user string, notAfter time.Time, groups ...string) (certPEM, keyPEM []byte, err error) {
	t := certTemplate(pkix.Name{CommonName: user, Organization: groups})
	if !notAfter.After(t.NotBefore) {
		return nil, nil, fmt.Errorf("kube: ClientCertUntil %q: notAfter %s is not after notBefore %s",
			user, notAfter.Format(time.RFC3339), t.NotBefore.Format(time.RFC3339))
	}
	t.NotAfter = notAfter
	t.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return c.pki.issue(t)
}
