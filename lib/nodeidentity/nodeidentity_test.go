package nodeidentity

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// testCA is a throwaway CA certificate, for a valid ca_pem.
func testCA(t *testing.T) string {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// TestRESTConfig: the kubelet links its current pair by its path inside the
// node; the agent reads it from the identity directory on the host, in the
// default place or another one, and refuses a link leaving the kubelet's
// certificate directory.
func TestRESTConfig(t *testing.T) {
	root, err := hostroot.New(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{}
	cfg.Cluster.Server = "https://127.0.0.1:6443"
	cfg.Cluster.CAPEM = testCA(t)
	cfg.Cluster.BootstrapToken = "abcdef.0123456789abcdef"
	if _, err := RESTConfig(root, "", cfg); !errors.Is(err, ErrNoIdentity) {
		t.Fatalf("no identity yet: err %v, want ErrNoIdentity", err)
	}
	for _, hostDir := range []string{"", "/srv/identity"} {
		dir := filepath.Join(root.Prefix(), "opt/kubeslot/identity")
		if hostDir != "" {
			dir = filepath.Join(root.Prefix(), hostDir)
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		pair := []byte("cert and key in " + hostDir)
		if err := os.WriteFile(filepath.Join(dir, "kubelet-client-2026-12-02.pem"), pair, 0o600); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(dir, CurrentPair)
		if err := os.Symlink("/var/lib/kubelet/pki/kubelet-client-2026-12-02.pem", link); err != nil {
			t.Fatal(err)
		}
		rc, err := RESTConfig(root, hostDir, cfg)
		if err != nil {
			t.Fatalf("identity dir %q: %v", hostDir, err)
		}
		if string(rc.CertData) != string(pair) || string(rc.KeyData) != string(pair) || rc.Host != cfg.Cluster.Server ||
			string(rc.CAData) != cfg.Cluster.CAPEM || rc.Timeout != 0 || rc.WrapTransport == nil || rc.BearerToken != "" || rc.UserAgent != "" {
			t.Errorf("identity dir %q: rest config %+v", hostDir, rc)
		}
		// A link that leaves the kubelet's cert dir is refused.
		_ = os.Remove(link)
		if err := os.Symlink("/etc/shadow", link); err != nil {
			t.Fatal(err)
		}
		if _, err := RESTConfig(root, hostDir, cfg); err == nil || errors.Is(err, ErrNoIdentity) {
			t.Errorf("identity dir %q: link to /etc/shadow: err %v", hostDir, err)
		}
	}
}
