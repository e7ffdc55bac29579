package kube

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the throw-away certificate authority of one control plane. ECDSA
// P-256 throughout: an order of magnitude faster to generate than RSA on the
// slow CI cores, and every component accepts it.
type pki struct {
	dir string
	// admin client pair, also kept in memory for kubeconfigs
	adminCert, adminKey []byte
	caCert              *x509.Certificate
	caKey               *ecdsa.PrivateKey
	caPEM               []byte
}

// File names inside the pki directory.
const (
	caCertFile        = "ca.crt"
	caKeyFile         = "ca.key"
	apiserverCertFile = "apiserver.crt"
	apiserverKeyFile  = "apiserver.key"
	adminCertFile     = "admin.crt"
	adminKeyFile      = "admin.key"
	saKeyFile         = "sa.key"
	saPubFile         = "sa.pub"
)

// newPKI creates dir and writes the CA, the apiserver's serving pair, the
// admin client pair (O=system:masters) and the service-account key pair.
func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: CA key: %w", err)
	}
	tmpl := certTemplate(pkix.Name{CommonName: "kubeslot-rig-ca"})
	tmpl.IsCA = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("pki: CA certificate: %w", err)
	}
	caCert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: CA certificate: %w", err)
	}
	p := &pki{dir: dir, caCert: caCert, caKey: caKey, caPEM: pemBlock("CERTIFICATE", der)}
	caKeyPEM, err := keyPEM(caKey)
	if err != nil {
		return nil, err
	}
	if err := p.write(caCertFile, p.caPEM); err != nil {
		return nil, err
	}
	if err := p.write(caKeyFile, caKeyPEM); err != nil {
		return nil, err
	}

	serving := certTemplate(pkix.Name{CommonName: "kube-apiserver"})
	serving.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	// 10.0.0.1 is the first address of --service-cluster-ip-range: the
	// in-cluster "kubernetes" Service, should anything ever dial it.
	serving.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.IPv4(10, 0, 0, 1)}
	serving.DNSNames = []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
		"kubernetes.default.svc.cluster.local"}
	if err := p.issueToFiles(serving, apiserverCertFile, apiserverKeyFile); err != nil {
		return nil, err
	}
	admin := certTemplate(pkix.Name{CommonName: "kubeslot-admin", Organization: []string{"system:masters"}})
	admin.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if p.adminCert, p.adminKey, err = p.issue(admin); err != nil {
		return nil, err
	}
	if err := p.write(adminCertFile, p.adminCert); err != nil {
		return nil, err
	}
	if err := p.write(adminKeyFile, p.adminKey); err != nil {
		return nil, err
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: service-account key: %w", err)
	}
	saKeyPEM, err := keyPEM(saKey)
	if err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("pki: service-account public key: %w", err)
	}
	if err := p.write(saKeyFile, saKeyPEM); err != nil {
		return nil, err
	}
	if err := p.write(saPubFile, pemBlock("PUBLIC KEY", pub)); err != nil {
		return nil, err
	}
	return p, nil
}

// path is the absolute path of a file of the pki directory.
func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

func (p *pki) write(name string, data []byte) error {
	if err := os.WriteFile(p.path(name), data, 0o600); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	return nil
}

// issue signs a fresh key for tmpl with the CA and returns both as PEM.
func (p *pki) issue(tmpl *x509.Certificate) (certPEM, keyPEMBytes []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: key for %q: %w", tmpl.Subject.CommonName, err)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: certificate for %q: %w", tmpl.Subject.CommonName, err)
	}
	kp, err := keyPEM(key)
	if err != nil {
		return nil, nil, err
	}
	return pemBlock("CERTIFICATE", der), kp, nil
}

func (p *pki) issueToFiles(tmpl *x509.Certificate, certName, keyName string) error {
	c, k, err := p.issue(tmpl)
	if err != nil {
		return err
	}
	if err := p.write(certName, c); err != nil {
		return err
	}
	return p.write(keyName, k)
}

// clientCert issues a client certificate for user cn in groups orgs.
func (p *pki) clientCert(cn string, orgs ...string) (certPEM, keyPEMBytes []byte, err error) {
	t := certTemplate(pkix.Name{CommonName: cn, Organization: orgs})
	t.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return p.issue(t)
}

func certTemplate(subject pkix.Name) *x509.Certificate {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		// crypto/rand does not fail on Linux; a fixed serial would still work
		serial = big.NewInt(time.Now().UnixNano())
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      subject,
		// an hour of slack: the nodes' clocks are this machine's, but a
		// certificate minted "now" is rejected by a peer a second behind
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
	}
}

func keyPEM(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("pki: marshal key: %w", err)
	}
	return pemBlock("EC PRIVATE KEY", der), nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
