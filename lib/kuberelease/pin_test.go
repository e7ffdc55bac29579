package kuberelease

import (
	"context"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

// tlsMirror serves sums (version → the kubelet.sha256's content) over
// https and returns a Mirror that trusts it, with its base URL.
func tlsMirror(t *testing.T, sums map[string]string) (*Mirror, config.Release) {
	t.Helper()
	mux := http.NewServeMux()
	for v, body := range sums {
		mux.HandleFunc("/release/"+KubeletPath(v, runtime.GOARCH)+".sha256", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(body))
		})
	}
	srv := httptest.NewTLSServer(mux)
	t.Cleanup(srv.Close)
	rel := config.Release{Mirror: srv.URL + "/release",
		CAPEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))}
	m, err := NewMirror(testkit.Root(t), rel)
	if err != nil {
		t.Fatal(err)
	}
	return m, rel
}

// A plain http mirror is refused before any request, naming the setting
// and the value, even when a configuration skipped validation.
func TestPinRefusesHTTPMirror(t *testing.T) {
	var hits int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits++
		w.Write([]byte(sum))
	}))
	defer srv.Close()
	m, err := NewMirror(testkit.Root(t), config.Release{Mirror: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(srv.URL + "/release")
	err = Pin(context.Background(), m, cfg)
	if err == nil || !strings.Contains(err.Error(), "kubernetes.release.mirror") || !strings.Contains(err.Error(), srv.URL) || !strings.Contains(err.Error(), "https") {
		t.Errorf("http mirror: %v, want an error naming kubernetes.release.mirror, its value and https", err)
	}
	if hits != 0 || cfg.Artifacts.KubeletPinned != nil {
		t.Errorf("http mirror asked %d times, pinned %+v", hits, cfg.Artifacts.KubeletPinned)
	}
}

// The https mirror may redirect to https, never to http.
func TestMirrorClientRefusesRedirectToHTTP(t *testing.T) {
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(sum)) }))
	defer plain.Close()
	var tlsURL string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasPrefix(r.URL.Path, "/other/"):
			w.Write([]byte(sum))
		case strings.Contains(r.URL.Path, "v1.37.2"):
			http.Redirect(w, r, plain.URL+r.URL.Path, http.StatusFound)
		case strings.Contains(r.URL.Path, "v1.37.1"):
			http.Redirect(w, r, tlsURL+"/other"+r.URL.Path, http.StatusFound)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	tlsURL = srv.URL
	rel := config.Release{Mirror: srv.URL + "/release",
		CAPEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))}
	m, err := NewMirror(testkit.Root(t), rel)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(rel.Mirror)
	cfg.Kubernetes.Release = rel
	err = Pin(context.Background(), m, cfg)
	if !errors.Is(err, ErrInsecureRedirect) || !strings.Contains(err.Error(), plain.URL) {
		t.Errorf("redirect to http: %v, want %v naming %s", err, ErrInsecureRedirect, plain.URL)
	}
	// The download client is the same: the kubelet itself is refused too.
	c, err := Client(testkit.Root(t), rel)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Get(KubeletURL(rel.Mirror, "1.37.2"))
	if err == nil {
		resp.Body.Close()
	}
	if !errors.Is(err, ErrInsecureRedirect) {
		t.Errorf("download redirected to http: %v, want %v", err, ErrInsecureRedirect)
	}
	cfg.Kubernetes.Version = "1.37.1"
	if err := Pin(context.Background(), m, cfg); err != nil {
		t.Errorf("redirect to https: %v", err)
	}
}

func TestPinOperatorDigest(t *testing.T) {
	lower := strings.ToLower(sum)
	other := strings.Repeat("0", 64)
	m, rel := tlsMirror(t, map[string]string{"1.37.2": sum + "\n", "1.37.1": other + "  kubelet\n"})
	ctx := context.Background()
	cfgFor := func(v, pin string) *config.Config {
		c := testConfig(rel.Mirror)
		c.Kubernetes.Release = rel
		c.Kubernetes.Version = v
		c.Kubernetes.Release.KubeletSHA256 = map[string]string{v: pin}
		return c
	}

	// The pin and the mirror agree: the pin is what the download is checked against.
	c := cfgFor("1.37.2", lower)
	if err := Pin(ctx, m, c); err != nil || c.Artifacts.KubeletPinned == nil || c.Artifacts.KubeletPinned.SHA256 != lower {
		t.Fatalf("agreeing pin: %v, pinned %+v", err, c.Artifacts.KubeletPinned)
	}

	// The mirror publishes another digest than the operator pinned: refused.
	c = cfgFor("1.37.1", lower)
	err := Pin(ctx, m, c)
	for _, want := range []string{"kubernetes.release.kubelet_sha256", "1.37.1", lower, other} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("mirror disagrees with the pin: %v, want an error containing %q", err, want)
		}
	}
	if c.Artifacts.KubeletPinned != nil {
		t.Errorf("disagreement recorded %+v", c.Artifacts.KubeletPinned)
	}

	// The mirror publishes no digest: the pin alone is enough.
	c = cfgFor("1.37.0", lower)
	if err := Pin(ctx, m, c); err != nil || c.Artifacts.KubeletPinned == nil || c.Artifacts.KubeletPinned.SHA256 != lower {
		t.Errorf("pin without the mirror's digest: %v, pinned %+v", err, c.Artifacts.KubeletPinned)
	}

	// A pin recorded from the mirror before the operator pinned another
	// digest is not kept: the lookup runs again and fails on the mismatch.
	c = cfgFor("1.37.2", other)
	c.Artifacts.KubeletPinned = &config.Artifact{URL: KubeletURL(rel.Mirror, "1.37.2"), SHA256: lower}
	if err := Pin(ctx, m, c); err == nil || !strings.Contains(err.Error(), other) {
		t.Errorf("stale pin against the operator's: %v, want a mismatch naming %s", err, other)
	}

	// A pin for another version leaves this one to the mirror's digest.
	c = cfgFor("1.37.2", other)
	c.Kubernetes.Release.KubeletSHA256 = map[string]string{"1.36.0": other}
	if err := Pin(ctx, m, c); err != nil || c.Artifacts.KubeletPinned.SHA256 != lower {
		t.Errorf("unpinned version: %v, pinned %+v", err, c.Artifacts.KubeletPinned)
	}
}
