package bootstrap

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
	"github.com/kubeslot/kubeslot/lib/verify/verifytest"
)

// tokenHost is a fresh host with the operator's configuration file (with a
// comment, mode 0640) and a configured slot a whose bootstrap kubeconfig
// holds the token, as the nspawn backend writes it before the first join.
type tokenHost struct {
	f    *fakes
	cfg  *config.Config
	text string
	log  *bytes.Buffer
	// joins says the kubelet gets its identity when the node is Ready.
	joins bool
}

// joiningCluster is the fake cluster whose Node Ready wait leaves the
// kubelet's client pair in the identity directory, as a real join does.
type joiningCluster struct {
	fakeCluster
	t    *testing.T
	root *hostroot.Root
}

func (c joiningCluster) WaitReady(ctx context.Context, cfg *config.Config, since time.Time) error {
	must(c.t, os.MkdirAll(filepath.Join(c.root.Prefix(), "opt/kubeslot/identity"), 0o700))
	verifytest.Identity(c.t, c.root, time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour))
	return c.fakeCluster.WaitReady(ctx, cfg, since)
}

func newTokenHost(t *testing.T) *tokenHost {
	f := newFakes(t)
	doc := testhost.Doc{Machine: "worker-1", CA: testkit.SharedCA(), Tables: "[timeouts]\nlock = \"1s\"\nnode_ready = \"10s\"\n"}
	text := "# the operator's own comment\n" + doc.Text(t)
	h := &tokenHost{f: f, cfg: testhost.Config(t, doc), text: text, log: &bytes.Buffer{}}
	if h.cfg.Cluster.BootstrapToken == "" {
		t.Fatal("the test configuration has no join token")
	}
	h.put(t, "/etc/kubeslot/config.toml", text, 0o640)
	h.put(t, "/var/lib/machines/a/etc/kubernetes/bootstrap-kubelet.conf", "token: "+h.cfg.Cluster.BootstrapToken.Reveal()+"\n", 0o600)
	return h
}

func (h *tokenHost) put(t *testing.T, p, data string, mode os.FileMode) {
	t.Helper()
	local := filepath.Join(h.f.root.Prefix(), p)
	must(t, os.MkdirAll(filepath.Dir(local), 0o755))
	must(t, os.WriteFile(local, []byte(data), mode))
	must(t, os.Chmod(local, mode))
}

func (h *tokenHost) read(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(h.f.root.Prefix(), p))
	must(t, err)
	return string(b)
}

func (h *tokenHost) run(t *testing.T) {
	t.Helper()
	d := h.f.deps()
	d.ConfigFile = "/etc/kubeslot/config.toml"
	d.Log = slog.New(slog.NewTextHandler(h.log, nil))
	if h.joins {
		d.Cluster = joiningCluster{fakeCluster{h.f}, t, h.f.root}
	}
	if _, err := Run(t.Context(), d, h.cfg); err != nil {
		t.Fatalf("%v\n%s", err, h.log)
	}
}

// TestJoinTokenDroppedAfterJoin: once the node identity is on disk, the
// bootstrap's commit takes the token out of the configuration file (a
// comment in its place, every other byte and the mode kept), out of the
// applied configuration and out of the slot's bootstrap kubeconfig, and
// logs what it did without the token; a second run finds nothing to do.
func TestJoinTokenDroppedAfterJoin(t *testing.T) {
	h := newTokenHost(t)
	token := h.cfg.Cluster.BootstrapToken.Reveal()
	h.joins = true
	h.run(t)

	got := h.read(t, "/etc/kubeslot/config.toml")
	want := strings.Replace(h.text, `bootstrap_token = "`+token+`"`, "# "+joinTokenNote, 1)
	if got != want {
		t.Errorf("configuration after the join:\n%s\nwant:\n%s", got, want)
	}
	if fi, err := os.Stat(filepath.Join(h.f.root.Prefix(), "etc/kubeslot/config.toml")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("configuration mode changed: %v %v", fi.Mode(), err)
	}
	a, err := state.NewStore(h.f.root).LoadApplied("a")
	if err != nil || a.Config.Cluster.BootstrapToken != "" {
		t.Errorf("applied configuration keeps the token: %v", err)
	}
	kc := h.read(t, "/var/lib/machines/a/etc/kubernetes/bootstrap-kubelet.conf")
	if strings.Contains(kc, token) || !strings.Contains(kc, h.cfg.Cluster.Server) || strings.Contains(kc, `"token"`) {
		t.Errorf("slot's bootstrap kubeconfig:\n%s", kc)
	}
	logs := h.log.String()
	if !strings.Contains(logs, "join token removed from the configuration") || strings.Contains(logs, token) ||
		strings.Contains(logs, strings.Split(token, ".")[1]) {
		t.Errorf("log (want the removal named, never the token):\n%s", logs)
	}

	// Idempotent: a run over the complete host changes none of it.
	h.log.Reset()
	h.run(t)
	if again := h.read(t, "/etc/kubeslot/config.toml"); again != want {
		t.Errorf("second run changed the configuration:\n%s", again)
	}
	if strings.Contains(h.log.String(), "join token removed") {
		t.Errorf("second run removed a token again:\n%s", h.log)
	}
}

// TestJoinTokenKeptWithoutIdentity: before the node has its identity the
// token stays everywhere (a later run may still need to join).
func TestJoinTokenKeptWithoutIdentity(t *testing.T) {
	h := newTokenHost(t)
	h.run(t)
	if got := h.read(t, "/etc/kubeslot/config.toml"); got != h.text {
		t.Errorf("configuration changed without an identity:\n%s", got)
	}
	a, err := state.NewStore(h.f.root).LoadApplied("a")
	if err != nil || a.Config.Cluster.BootstrapToken == "" {
		t.Errorf("applied configuration lost the token without an identity: %v", err)
	}
	if !strings.Contains(h.log.String(), "join token kept") {
		t.Errorf("log:\n%s", h.log)
	}
}

// TestJoinTokenDroppedOnCompleteHost: a host that joined with a token
// before (applied configuration and file holding it) loses it at the next
// run over the complete host.
func TestJoinTokenDroppedOnCompleteHost(t *testing.T) {
	h := newTokenHost(t)
	token := h.cfg.Cluster.BootstrapToken.Reveal()
	h.run(t) // no identity yet: kept
	// The other slot as an earlier release left it: configured with the token, its applied configuration too.
	store := state.NewStore(h.f.root)
	old, err := store.LoadApplied("a")
	must(t, err)
	if old.Config.Cluster.BootstrapToken == "" {
		t.Fatal("slot a's applied configuration has no token before the identity exists")
	}
	old.Slot = "b"
	must(t, store.SaveApplied(old))
	h.put(t, "/var/lib/machines/b/etc/kubernetes/bootstrap-kubelet.conf", "token: "+token+"\n", 0o600)
	must(t, os.MkdirAll(filepath.Join(h.f.root.Prefix(), "opt/kubeslot/identity"), 0o700))
	verifytest.Identity(t, h.f.root, time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour))
	h.log.Reset()
	h.run(t)
	if got := h.read(t, "/etc/kubeslot/config.toml"); strings.Contains(got, token) {
		t.Errorf("configuration keeps the token:\n%s", got)
	}
	for _, slot := range []string{"a", "b"} {
		a, err := store.LoadApplied(slot)
		if err != nil || a.Config.Cluster.BootstrapToken != "" {
			t.Errorf("slot %s: applied configuration keeps the token: %v", slot, err)
		}
		if got := h.read(t, "/var/lib/machines/"+slot+"/etc/kubernetes/bootstrap-kubelet.conf"); strings.Contains(got, token) {
			t.Errorf("slot %s: bootstrap kubeconfig keeps the token:\n%s", slot, got)
		}
	}
	if !strings.Contains(h.log.String(), "join token removed from the applied configuration") {
		t.Errorf("log:\n%s", h.log)
	}
}
