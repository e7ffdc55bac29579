package bootstrap

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestNodeIdentity: the kubelet links its current pair by its path inside
// the node; the bootstrap reads it from the identity directory on the host.
func TestNodeIdentity(t *testing.T) {
	f := newFakes(t)
	cfg := testConfig(t, "worker-1")
	c := &NodeCluster{Root: f.root, Log: slog.New(slog.DiscardHandler)}
	if _, err := c.RESTConfig(cfg); !errors.Is(err, ErrNoIdentity) {
		t.Fatalf("no identity yet: err %v, want ErrNoIdentity", err)
	}
	dir := filepath.Join(f.root.Prefix(), "opt/kubeslot/identity")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	pair := []byte("cert and key")
	if err := os.WriteFile(filepath.Join(dir, "kubelet-client-2026-12-02.pem"), pair, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "kubelet-client-current.pem")
	if err := os.Symlink("/var/lib/kubelet/pki/kubelet-client-2026-12-02.pem", link); err != nil {
		t.Fatal(err)
	}
	rc, err := c.RESTConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if string(rc.CertData) != string(pair) || string(rc.KeyData) != string(pair) || rc.Host != cfg.Cluster.Server ||
		string(rc.CAData) != cfg.Cluster.CAPEM || rc.Timeout != 0 || rc.WrapTransport == nil || rc.BearerToken != "" {
		t.Errorf("rest config %+v", rc)
	}
	// A link that leaves the kubelet's cert dir is refused.
	_ = os.Remove(link)
	if err := os.Symlink("/etc/shadow", link); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RESTConfig(cfg); err == nil || errors.Is(err, ErrNoIdentity) {
		t.Errorf("identity link to /etc/shadow: err %v", err)
	}
}

func TestInstallLinks(t *testing.T) {
	unit := []byte(`[Unit]
Description=x
# WantedBy=not.target
[Service]
ExecStart=/bin/true
[Install]
WantedBy=multi-user.target paths.target
RequiredBy=foo.target
Alias=bar.service
`)
	got := installLinks("x.service", unit)
	want := []string{"/etc/systemd/system/multi-user.target.wants/x.service",
		"/etc/systemd/system/paths.target.wants/x.service", "/etc/systemd/system/foo.target.requires/x.service"}
	if !slices.Equal(got, want) {
		t.Errorf("links %v, want %v", got, want)
	}
	if enabled("x@.service", unit) {
		t.Errorf("a template counts as enabled")
	}
	if len(installLinks("y.service", []byte("[Service]\nExecStart=/bin/true\n"))) != 0 {
		t.Errorf("a unit without [Install] has links")
	}
}

func TestPreflightChangesNothing(t *testing.T) {
	f := newFakes(t)
	var out strings.Builder
	if err := Preflight(t.Context(), f.deps(), testConfig(t, "worker-1"), &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"fresh installation", "slot a: change", "slot rootfs: copy, no fast path: root prefix", "preflight: ok"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("preflight output lacks %q:\n%s", want, out.String())
		}
	}
	if ents, _ := os.ReadDir(f.root.Prefix()); len(ents) != 0 {
		t.Errorf("preflight created %v", ents)
	}
	// A different installation: blocked, exit 1.
	if _, err := Run(t.Context(), f.deps(), testConfig(t, "worker-1")); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := Preflight(t.Context(), f.deps(), testConfig(t, "worker-2"), &out); err == nil || !strings.Contains(out.String(), "BLOCKED") {
		t.Errorf("preflight of another machine: %v\n%s", err, out.String())
	}
}
