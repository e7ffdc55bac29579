package mirror

// The same files over https, for what kubeslot fetches only from an https
// mirror (the Kubernetes release tree): a CA made for this server alone,
// which the rig hands the agent as the mirror's CA (kubernetes.release
// ca_pem), so no sandbox exception lets the agent take plain http.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"path"
	"strings"
	"time"
)

// selfSigned makes a CA certificate valid for 127.0.0.1 that also serves:
// one certificate, trusted as the root, is all a loopback test needs.
func selfSigned() (tls.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("mirror: key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("mirror: serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "kubeslot test mirror"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("mirror: certificate: %w", err)
	}
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	return cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// TLSURL is the address of a file over https; CAPEM is the CA to trust.
func (s *Server) TLSURL(name string) string {
	return "https://" + s.tlsLn.Addr().String() + "/" + strings.TrimPrefix(path.Clean("/"+name), "/")
}

// TLSAddr is the https listener's "127.0.0.1:port", for forwarding it into
// a host with a network namespace of its own.
func (s *Server) TLSAddr() string { return s.tlsLn.Addr().String() }

// Addr is the plain http listener's "127.0.0.1:port".
func (s *Server) Addr() string { return s.ln.Addr().String() }

// CAPEM is the PEM certificate that signs the https listener's.
func (s *Server) CAPEM() string { return string(s.caPEM) }
