package nodeidentity

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

// TestRESTConfig: the kubelet links its current pair by its path inside the
// node; the agent reads it from the identity directory on the host, in the
// default place or another one, and refuses a link leaving the kubelet's
// certificate directory.
func TestRESTConfig(t *testing.T) {
	root := testkit.Root(t)
	cfg := &config.Config{}
	cfg.Cluster.Server = "https://127.0.0.1:6443"
	cfg.Cluster.CAPEM = testkit.CA(t)
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
