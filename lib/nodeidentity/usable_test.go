package nodeidentity_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
	"github.com/kubeslot/kubeslot/lib/nodeidentity"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/verify/verifytest"
)

const token = "abcdef.0123456789abcdef"

// TestSlotCredentials: with a usable identity a slot's bootstrap
// kubeconfig has the server and CA but not the join token, whether the
// configuration still holds one or not; an expired identity falls back to
// the token; with neither, the error says a new token is needed and where
// it goes, and the identity's place.
func TestSlotCredentials(t *testing.T) {
	root := testkit.Root(t)
	cfg := &config.Config{}
	cfg.Cluster.Server = "https://127.0.0.1:6443"
	cfg.Cluster.CAPEM = testkit.CA(t)
	cfg.Cluster.BootstrapToken = token
	now := time.Now()

	c, err := nodeidentity.SlotCredentials(root, cfg, now)
	if err != nil || !strings.Contains(string(c.BootstrapKubeconfig), token) {
		t.Fatalf("no identity yet: want the token: %v", err)
	}
	if err := os.MkdirAll(filepath.Join(root.Prefix(), "opt/kubeslot/identity"), 0o700); err != nil {
		t.Fatal(err)
	}
	verifytest.Identity(t, root, now.Add(-time.Hour), now.Add(time.Hour))
	for _, tok := range []config.Secret{token, ""} {
		cfg.Cluster.BootstrapToken = tok
		c, err := nodeidentity.SlotCredentials(root, cfg, now)
		if err != nil {
			t.Fatalf("identity, token %v: %v", tok != "", err)
		}
		kc := string(c.BootstrapKubeconfig)
		if strings.Contains(kc, token) || strings.Contains(kc, `"token"`) || !strings.Contains(kc, cfg.Cluster.Server) ||
			len(c.CAPEM) == 0 {
			t.Errorf("identity, token %v: bootstrap kubeconfig\n%s", tok != "", kc)
		}
	}
	// Expired (two hours on): the token again, or the error asking for one.
	later := now.Add(2 * time.Hour)
	cfg.Cluster.BootstrapToken = token
	if c, err := nodeidentity.SlotCredentials(root, cfg, later); err != nil || !strings.Contains(string(c.BootstrapKubeconfig), token) {
		t.Errorf("expired identity: want the token: %v", err)
	}
	cfg.Cluster.BootstrapToken = ""
	_, err = nodeidentity.SlotCredentials(root, cfg, later)
	if !errors.Is(err, nodeconfig.ErrNoJoinCredential) {
		t.Fatalf("expired identity, no token: %v", err)
	}
	for _, want := range []string{"cluster.bootstrap_token", "new bootstrap token", "/etc/kubeslot/config.toml",
		"/opt/kubeslot/identity/kubelet-client-current.pem"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	// Lost: no identity files at all.
	if err := os.RemoveAll(filepath.Join(root.Prefix(), "opt/kubeslot/identity")); err != nil {
		t.Fatal(err)
	}
	if _, err := nodeidentity.SlotCredentials(root, cfg, now); !errors.Is(err, nodeconfig.ErrNoJoinCredential) {
		t.Errorf("lost identity, no token: %v", err)
	}
}

// TestRESTConfigWithoutToken: the agent's client needs the CA and the
// identity only, so a configuration whose token was removed still works.
func TestRESTConfigWithoutToken(t *testing.T) {
	root := testkit.Root(t)
	cfg := &config.Config{}
	cfg.Cluster.Server = "https://127.0.0.1:6443"
	cfg.Cluster.CAPEM = testkit.CA(t)
	if err := os.MkdirAll(filepath.Join(root.Prefix(), "opt/kubeslot/identity"), 0o700); err != nil {
		t.Fatal(err)
	}
	verifytest.Identity(t, root, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if rc, err := nodeidentity.RESTConfig(root, "", cfg); err != nil || len(rc.CAData) == 0 {
		t.Errorf("no token: %v", err)
	}
}
