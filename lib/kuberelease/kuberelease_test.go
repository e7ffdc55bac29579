package kuberelease

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

func TestCheckSkew(t *testing.T) {
	for _, tc := range []struct {
		kubelet, apiserver string
		want               string // "" = allowed, else part of the error
	}{
		{"1.37.2", "v1.37.2", ""},
		{"1.37.3", "v1.37.2", ""}, // the policy compares minors
		{"1.36.3", "v1.37.2", ""},
		{"1.34.0", "v1.37.2-eks-1", ""},
		{"1.33.9", "v1.37.2", "4 minor versions older"},
		{"1.38.0", "v1.37.2", "newer than the API server"},
		{"2.0.0", "v1.37.2", "another major version"},
		{"1.37.2", "garbage", "API server version"},
	} {
		err := CheckSkew(tc.kubelet, tc.apiserver)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s against %s: %v, want allowed", tc.kubelet, tc.apiserver, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s against %s: %v, want an error containing %q", tc.kubelet, tc.apiserver, err, tc.want)
		case tc.want != "" && tc.want != "API server version" && !strings.Contains(err.Error(), "skew policy"):
			t.Errorf("%s against %s: %v does not name the rule", tc.kubelet, tc.apiserver, err)
		}
	}
}

func TestParseKubeletVersion(t *testing.T) {
	for out, want := range map[string]string{
		"Kubernetes v1.37.2\n":                 "1.37.2",
		"Kubernetes v1.38.0-rc.1":              "1.38.0-rc.1",
		"Kubernetes v0.0.0-master+$Format:%H$": "", // an unstamped build names no release
		"kubelet 1.37.2":                       "",
		"":                                     "",
		"Kubernetes 1.37":                      "",
	} {
		got, err := ParseKubeletVersion([]byte(out))
		if (err == nil) != (want != "") || got != want {
			t.Errorf("%q: %q, %v; want %q", out, got, err, want)
		}
	}
	if !SameRelease("v1.37.2", "1.37.2") || SameRelease("v1.37.1", "1.37.2") || SameRelease("x", "1.37.2") {
		t.Error("SameRelease")
	}
}

const sum = "ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789"

func testConfig(mirror string) *config.Config {
	c := &config.Config{}
	c.Kubernetes.Version = "1.37.2"
	c.Kubernetes.Release.Mirror = mirror
	return c
}

func TestPinFromHTTPSMirrorWithItsCA(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		switch r.URL.Path {
		case "/release/" + KubeletPath("1.37.2", runtime.GOARCH) + ".sha256":
			w.Write([]byte(sum + "\n")) // upstream: the digest alone
		case "/release/" + KubeletPath("1.37.1", runtime.GOARCH) + ".sha256":
			w.Write([]byte(strings.ToLower(sum) + "  kubelet\n")) // sha256sum's form
		case "/release/" + KubeletPath("1.37.3", runtime.GOARCH) + ".sha256":
			w.Write([]byte("<html>not found</html>"))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	root := testkit.Root(t)
	ctx := context.Background()
	// Without the CA the mirror's certificate is not trusted.
	plain, _ := NewMirror(root, config.Release{Mirror: srv.URL + "/release"})
	if err := Pin(ctx, plain, testConfig(srv.URL+"/release")); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("pin without the mirror's CA: %v, want a certificate error", err)
	}
	ca := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	rel := config.Release{Mirror: srv.URL + "/release/", CAPEM: ca}
	m, err := NewMirror(root, rel)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(rel.Mirror)
	if err := Pin(ctx, m, cfg); err != nil {
		t.Fatal(err)
	}
	want := config.Artifact{URL: srv.URL + "/release/" + KubeletPath("1.37.2", runtime.GOARCH), SHA256: strings.ToLower(sum)}
	if cfg.Artifacts.KubeletPinned == nil || *cfg.Artifacts.KubeletPinned != want {
		t.Fatalf("pinned %+v, want %+v", cfg.Artifacts.KubeletPinned, want)
	}
	if got, err := cfg.KubeletArtifact(); err != nil || got != want {
		t.Errorf("KubeletArtifact: %v %v", got, err)
	}
	// Pinned for this version already: no request.
	n := hits.Load()
	if err := Pin(ctx, m, cfg); err != nil || hits.Load() != n {
		t.Errorf("second pin: %v, %d requests", err, hits.Load()-n)
	}
	// Another version pins again; sha256sum's form is read too.
	cfg.Kubernetes.Version = "1.37.1"
	if err := Pin(ctx, m, cfg); err != nil || !strings.HasSuffix(cfg.Artifacts.KubeletPinned.URL, "/v1.37.1/bin/linux/"+runtime.GOARCH+"/kubelet") {
		t.Errorf("pin 1.37.1: %v %+v", err, cfg.Artifacts.KubeletPinned)
	}
	for v, msg := range map[string]string{"1.37.3": "not a sha256 digest", "1.37.9": "404"} {
		c := testConfig(rel.Mirror)
		c.Kubernetes.Version = v
		if err := Pin(ctx, m, c); err == nil || !strings.Contains(err.Error(), msg) || !strings.Contains(err.Error(), "kubernetes.release.mirror") {
			t.Errorf("pin %s: %v, want an error naming the mirror and %q", v, err, msg)
		}
		if c.Artifacts.KubeletPinned != nil {
			t.Errorf("pin %s failed but recorded %+v", v, c.Artifacts.KubeletPinned)
		}
	}
	// An explicit kubelet wins: no request.
	c := testConfig(rel.Mirror)
	c.Artifacts.Kubelet = config.Artifact{URL: "/srv/kubelet", SHA256: strings.ToLower(sum)}
	n = hits.Load()
	if err := Pin(ctx, m, c); err != nil || c.Artifacts.KubeletPinned != nil || hits.Load() != n {
		t.Errorf("explicit kubelet: %v, pinned %+v, %d requests", err, c.Artifacts.KubeletPinned, hits.Load()-n)
	}
}

func TestPinFromLocalMirror(t *testing.T) {
	prefix := t.TempDir()
	root := testkit.RootAt(t, prefix)
	p := filepath.Join(prefix, "srv/k8s", KubeletPath("1.37.2", runtime.GOARCH)+".sha256")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(sum), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := NewMirror(root, config.Release{Mirror: "/srv/k8s"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig("/srv/k8s")
	if err := Pin(context.Background(), m, cfg); err != nil {
		t.Fatal(err)
	}
	if got := cfg.Artifacts.KubeletPinned; got == nil || got.URL != "/srv/k8s/"+KubeletPath("1.37.2", runtime.GOARCH) {
		t.Errorf("pinned %+v", got)
	}
}
