package oci

import (
	"archive/tar"
	"errors"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/oci/ocitest"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/unpack"
)

type E = ocitest.Entry

// testImage has a lower layer with files, a directory and a symlink, and
// an upper layer that changes a file, whites out another, and adds one.
func testImage(t *testing.T) ([]byte, []byte) {
	lower := ocitest.Layer(t,
		E{Name: "etc/"},
		E{Name: "etc/os-release", Body: "ID=debian\n"},
		E{Name: "etc/old.conf", Body: "to be deleted\n"},
		E{Name: "etc/motd", Body: "lower\n"},
		E{Name: "usr/bin/", Mode: 0o755},
		E{Name: "usr/bin/true", Body: "#!/bin/sh\n", Mode: 0o755},
		E{Name: "bin", Type: tar.TypeSymlink, Link: "usr/bin"},
		E{Name: "var/lib/empty/"},
	)
	upper := ocitest.Layer(t,
		E{Name: "etc/.wh.old.conf"},
		E{Name: "etc/motd", Body: "upper\n"},
		E{Name: "opt/tool", Body: "tool\n", Mode: 0o755},
	)
	return lower, upper
}

type env struct {
	t    *testing.T
	root *hostroot.Root
	reg  *ocitest.Registry
	f    *Fetcher
}

func newEnv(t *testing.T) *env {
	root := testkit.LaidOut(t)
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	return &env{t: t, root: root, reg: ocitest.NewRegistry(t), f: &Fetcher{Root: root, Log: log, Timeout: 30 * time.Second}}
}

func (e *env) source(repo string) string { return "oci://" + e.reg.Host + "/" + repo }

// cacheFiles lists what is in <base>/cache/oci (absent: none).
func (e *env) cacheFiles() []string {
	dir, err := e.root.Path(hostroot.CacheDir, CacheSubdir)
	if err != nil {
		e.t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, d := range ents {
		out = append(out, d.Name())
	}
	return out
}

func unpackInto(t *testing.T, tarPath string) string {
	t.Helper()
	dest := filepath.Join(t.TempDir(), "rootfs")
	f, err := os.Open(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unpack.Tar(t.Context(), f, dest, unpack.Options{RequireEmpty: true}); err != nil {
		t.Fatal(err)
	}
	return dest
}

func TestPullFlattenAndCache(t *testing.T) {
	e := newEnv(t)
	lower, upper := testImage(t)
	dgst := e.reg.Push(t, "node/bookworm", "v1", ocitest.Image(t, "", lower, upper))

	// A tag in the source is allowed and does not take part: it names a tag
	// that does not exist.
	p, err := e.f.Ensure(t.Context(), e.source("node/bookworm:not-pushed"), dgst)
	if err != nil {
		t.Fatal(err)
	}
	first := e.reg.Requests()
	t.Logf("first pull: %d registry requests: %q", len(first), first)
	if !slices.ContainsFunc(first, func(s string) bool { return strings.Contains(s, "/blobs/") }) {
		t.Errorf("the first pull fetched no blob: %q", first)
	}
	for _, r := range first {
		if strings.Contains(r, "not-pushed") {
			t.Errorf("the tag was used: %s", r)
		}
	}
	dest := unpackInto(t, p)
	for name, want := range map[string]string{"etc/os-release": "ID=debian\n", "etc/motd": "upper\n", "opt/tool": "tool\n", "usr/bin/true": "#!/bin/sh\n"} {
		if b, err := os.ReadFile(filepath.Join(dest, name)); err != nil || string(b) != want {
			t.Errorf("%s: %q %v, want %q", name, b, err, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(dest, "etc/old.conf")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("whited-out etc/old.conf: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dest, "etc/.wh.old.conf")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("whiteout marker written: %v", err)
	}
	if l, err := os.Readlink(filepath.Join(dest, "bin")); err != nil || l != "usr/bin" {
		t.Errorf("bin link: %q %v", l, err)
	}
	if fi, err := os.Stat(filepath.Join(dest, "var/lib/empty")); err != nil || !fi.IsDir() {
		t.Errorf("var/lib/empty: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dest, "opt/tool")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("opt/tool mode: %v %v", fi.Mode(), err)
	}
	if got, want := e.cacheFiles(), []string{filepath.Base(p), filepath.Base(p) + ".sha256"}; !slices.Equal(got, want) {
		t.Errorf("cache: %q, want %q", got, want)
	}

	// Second time: from the cache, no request at all.
	start := time.Now()
	p2, err := e.f.Ensure(t.Context(), e.source("node/bookworm"), dgst)
	if err != nil || p2 != p {
		t.Fatalf("second Ensure: %q %v", p2, err)
	}
	t.Logf("cache hit took %s", time.Since(start))
	if r := e.reg.Requests(); len(r) != 0 {
		t.Errorf("cache hit made registry requests: %q", r)
	}

	// A damaged entry is pulled again.
	if err := os.WriteFile(p, []byte("damaged"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := e.f.Ensure(t.Context(), e.source("node/bookworm"), dgst); err != nil {
		t.Fatal(err)
	}
	if len(e.reg.Requests()) == 0 {
		t.Error("damaged cache entry was trusted")
	}
	unpackInto(t, p)
}

func TestWrongDigestRefused(t *testing.T) {
	e := newEnv(t)
	lower, upper := testImage(t)
	e.reg.Push(t, "node/bookworm", "v1", ocitest.Image(t, "", lower, upper))
	// The digest of another image: the registry has no such manifest.
	other := e.reg.Push(t, "node/other", "v1", ocitest.Image(t, "", lower))
	_, err := e.f.Ensure(t.Context(), e.source("node/bookworm:v1"), other)
	if err == nil || !strings.Contains(err.Error(), "rootfs.sha256") || !strings.Contains(err.Error(), e.reg.Host+"/node/bookworm@sha256:"+other) {
		t.Fatalf("want a refusal naming the reference and rootfs.sha256, got %v", err)
	}
	t.Log(err)
	if c := e.cacheFiles(); len(c) != 0 {
		t.Errorf("cache after a refused pull: %q", c)
	}
	// A digest written in the source must agree with sha256.
	if _, err := e.f.Ensure(t.Context(), e.source("node/bookworm@sha256:"+strings.Repeat("a", 64)), other); err == nil || !strings.Contains(err.Error(), "must agree") {
		t.Errorf("conflicting digests: %v", err)
	}
}

// A registry serving other content than the digests name is caught: the
// manifest against the configured digest, a layer against the manifest.
func TestTamperedContentRefused(t *testing.T) {
	e := newEnv(t)
	lower, upper := testImage(t)
	img := ocitest.Image(t, "", lower, upper)
	real := e.reg.Push(t, "node/x", "v1", img)
	fake := strings.Repeat("cd", 32)
	e.reg.Swap("/v2/node/x/manifests/sha256:"+fake, "/v2/node/x/manifests/sha256:"+real)
	if _, err := e.f.Ensure(t.Context(), e.source("node/x"), fake); err == nil {
		t.Fatal("a manifest with another digest was accepted")
	} else {
		t.Log(err)
	}

	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	l0, _ := layers[0].Digest()
	l1, _ := layers[1].Digest()
	e.reg.Swap("/v2/node/x/blobs/"+l1.String(), "/v2/node/x/blobs/"+l0.String())
	_, err = e.f.Ensure(t.Context(), e.source("node/x"), real)
	if err == nil {
		t.Fatal("a layer with another digest was accepted")
	}
	t.Log(err)
	if c := e.cacheFiles(); len(c) != 0 {
		t.Errorf("cache: %q", c)
	}
}

func TestEscapingLayerRefused(t *testing.T) {
	e := newEnv(t)
	sentinel := t.TempDir()
	bad := ocitest.Layer(t, E{Name: "etc/"}, E{Name: "../escape", Body: "x"})
	dgst := e.reg.Push(t, "node/bad", "v1", ocitest.Image(t, "", ocitest.Layer(t, E{Name: "etc/ok", Body: "ok"}), bad))
	_, err := e.f.Ensure(t.Context(), e.source("node/bad"), dgst)
	if err == nil || !strings.Contains(err.Error(), "escape") {
		t.Fatalf("want a refusal of ../escape, got %v", err)
	}
	t.Log(err)
	if c := e.cacheFiles(); len(c) != 0 {
		t.Errorf("cache after a refused pull: %q", c)
	}
	for _, dir := range []string{sentinel, filepath.Dir(e.root.Prefix()), e.root.Prefix()} {
		if _, err := os.Lstat(filepath.Join(dir, "escape")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s/escape: %v", dir, err)
		}
	}

	// A relative link that climbs out is dropped by the flattening, never
	// written; links inside stay.
	links := ocitest.Layer(t, E{Name: "etc/"}, E{Name: "etc/shadow", Type: tar.TypeSymlink, Link: "../../../etc/shadow"},
		E{Name: "etc/ok", Type: tar.TypeSymlink, Link: "../usr/lib/os-release"}, E{Name: "etc/abs", Type: tar.TypeSymlink, Link: "/usr/lib/os-release"})
	dgst = e.reg.Push(t, "node/links", "v1", ocitest.Image(t, "", links))
	p, err := e.f.Ensure(t.Context(), e.source("node/links"), dgst)
	if err != nil {
		t.Fatal(err)
	}
	dest := unpackInto(t, p)
	if _, err := os.Lstat(filepath.Join(dest, "etc/shadow")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("escaping link written: %v", err)
	}
	for _, l := range []string{"etc/ok", "etc/abs"} {
		if _, err := os.Readlink(filepath.Join(dest, l)); err != nil {
			t.Errorf("%s: %v", l, err)
		}
	}
}

func TestUnreachableRegistry(t *testing.T) {
	e := newEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	e.f.Timeout = 20 * time.Second
	src := "oci://" + addr + "/node/bookworm"
	start := time.Now()
	_, err = e.f.Ensure(t.Context(), src, strings.Repeat("ab", 32))
	t.Logf("unreachable registry: failed after %s: %v", time.Since(start).Round(time.Millisecond), err)
	if err == nil || !strings.Contains(err.Error(), addr+"/node/bookworm@sha256:"+strings.Repeat("ab", 32)) {
		t.Fatalf("want an error naming the reference, got %v", err)
	}
	if c := e.cacheFiles(); len(c) != 0 {
		t.Errorf("cache: %q", c)
	}

	// A registry that accepts connections but never answers: bounded by
	// Timeout, and the error says which setting.
	hang, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hang.Close()
	e.f.Timeout = 500 * time.Millisecond
	start = time.Now()
	_, err = e.f.Ensure(t.Context(), "oci://"+hang.Addr().String()+"/node/bookworm", strings.Repeat("ab", 32))
	t.Logf("silent registry: failed after %s: %v", time.Since(start).Round(time.Millisecond), err)
	if err == nil || !strings.Contains(err.Error(), "timeouts.download") {
		t.Fatalf("want a timeout naming timeouts.download, got %v", err)
	}
}

func TestIndexPicksThisPlatform(t *testing.T) {
	e := newEnv(t)
	mine := ocitest.Image(t, runtime.GOARCH, ocitest.Layer(t, E{Name: "arch", Body: runtime.GOARCH}))
	otherArch := "s390x"
	if runtime.GOARCH == otherArch {
		otherArch = "arm64"
	}
	theirs := ocitest.Image(t, otherArch, ocitest.Layer(t, E{Name: "arch", Body: otherArch}))
	dgst := e.reg.PushIndex(t, "node/multi", "v1", ocitest.Index(t, map[string]v1.Image{runtime.GOARCH: mine, otherArch: theirs}))
	p, err := e.f.Ensure(t.Context(), e.source("node/multi"), dgst)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(unpackInto(t, p), "arch")); err != nil || string(b) != runtime.GOARCH {
		t.Errorf("arch: %q %v", b, err)
	}

	// A single image for another architecture is refused.
	dgst = e.reg.Push(t, "node/foreign", "v1", theirs)
	if _, err := e.f.Ensure(t.Context(), e.source("node/foreign"), dgst); !errors.Is(err, ErrPlatform) {
		t.Errorf("foreign image: %v", err)
	}
}

func TestSizeBound(t *testing.T) {
	e := newEnv(t)
	dgst := e.reg.Push(t, "node/big", "v1", ocitest.Image(t, "", ocitest.Layer(t, E{Name: "big", Body: strings.Repeat("x", 64<<10)})))
	e.f.MaxSize = 32 << 10
	if _, err := e.f.Ensure(t.Context(), e.source("node/big"), dgst); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("want ErrTooLarge, got %v", err)
	}
	if c := e.cacheFiles(); len(c) != 0 {
		t.Errorf("cache: %q", c)
	}
}

type failTransport struct{ t *testing.T }

func (f failTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	f.t.Errorf("request reached the network: %s", r.URL)
	return nil, errors.New("no")
}

func TestTLSGuard(t *testing.T) {
	g := tlsGuard{failTransport{t}}
	for _, u := range []string{"http://10.0.0.1:5000/v2/", "http://registry.example/v2/", "http://192.168.1.2/v2/x/blobs/sha256:00"} {
		pu, _ := url.Parse(u)
		if _, err := g.RoundTrip(&http.Request{URL: pu}); err == nil || !strings.Contains(err.Error(), "https") {
			t.Errorf("%s: %v", u, err)
		}
	}
}

// TestEnsureArchive: an image to preload is cached as a docker-archive
// tarball tagged with the source's reference (what containerd imports and
// pods name), pinned to the digest; a second call is a cache hit; a source
// without a tag is refused.
func TestEnsureArchive(t *testing.T) {
	e := newEnv(t)
	lower, upper := testImage(t)
	img := ocitest.Image(t, "", lower, upper)
	dgst := e.reg.Push(t, "apps/web", "v1", img)
	p, err := e.f.EnsureArchive(t.Context(), e.source("apps/web:v1"), dgst)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(p, ".image.tar") {
		t.Errorf("archive path %s", p)
	}
	tag, err := name.NewTag(e.reg.Host + "/apps/web:v1")
	if err != nil {
		t.Fatal(err)
	}
	got, err := tarball.ImageFromPath(p, &tag)
	if err != nil {
		t.Fatalf("the archive does not hold %s: %v", tag, err)
	}
	wantCfg, _ := img.ConfigName()
	if gotCfg, err := got.ConfigName(); err != nil || gotCfg != wantCfg {
		t.Errorf("archived image config %v %v, want %v", gotCfg, err, wantCfg)
	}
	e.reg.Requests() // the first pull's
	if p2, err := e.f.EnsureArchive(t.Context(), e.source("apps/web:v1"), dgst); err != nil || p2 != p {
		t.Errorf("second call: %s %v", p2, err)
	}
	if r := e.reg.Requests(); len(r) != 0 {
		t.Errorf("a cache hit asked the registry: %q", r)
	}
	if _, err := e.f.EnsureArchive(t.Context(), e.source("apps/web"), dgst); err == nil || !strings.Contains(err.Error(), "needs a tag") {
		t.Errorf("untagged source: %v", err)
	}
}
