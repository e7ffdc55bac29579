// Package ocitest serves an in-process OCI registry on 127.0.0.1 and builds
// small test images from tar entries, for the tests of lib/oci and of the
// isolation backends that pull node images. Imported only by tests and by
// the rig's demo program (integration/demo, through integration/workload).
package ocitest

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Registry is a running test registry that counts the requests it serves.
type Registry struct {
	// Host is "127.0.0.1:<port>".
	Host string
	mu   sync.Mutex
	reqs []string // "METHOD path"
	// swap serves another path's answer for a path: a registry (or a
	// cache in the way) that serves the wrong content.
	swap map[string]string
	srv  *httptest.Server
}

// Swap makes the registry answer requests for path with what it would
// answer for other (paths like "/v2/<repo>/manifests/sha256:<hex>").
func (r *Registry) Swap(path, other string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.swap == nil {
		r.swap = map[string]string{}
	}
	r.swap[path] = other
}

// NewRegistry starts a registry, stopped when the test ends.
func NewRegistry(t testing.TB) *Registry {
	t.Helper()
	r := Start()
	t.Cleanup(r.Close)
	return r
}

// Start starts a registry outside a test (the rig's demo program); Close
// stops it.
func Start() *Registry {
	r := &Registry{}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.reqs = append(r.reqs, req.Method+" "+req.URL.Path)
		if other, ok := r.swap[req.URL.Path]; ok {
			req.URL.Path = other
		}
		r.mu.Unlock()
		h.ServeHTTP(w, req)
	}))
	r.Host = strings.TrimPrefix(r.srv.URL, "http://")
	return r
}

// Close stops the registry.
func (r *Registry) Close() { r.srv.Close() }

// Requests returns the requests served so far and forgets them.
func (r *Registry) Requests() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.reqs
	r.reqs = nil
	return out
}

// Push stores img as repo:tag and returns its manifest digest (hex).
func (r *Registry) Push(t testing.TB, repo, tag string, img v1.Image) string {
	t.Helper()
	hex, err := r.PushImage(repo, tag, img)
	if err != nil {
		t.Fatal(err)
	}
	return hex
}

// PushImage is Push outside a test.
func (r *Registry) PushImage(repo, tag string, img v1.Image) (string, error) {
	ref, err := name.NewTag(r.Host+"/"+repo+":"+tag, name.Insecure)
	if err != nil {
		return "", err
	}
	if err := remote.Write(ref, img); err != nil {
		return "", err
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	r.Requests() // pushing is not what a test counts
	return d.Hex, nil
}

// PushIndex stores idx as repo:tag and returns its digest (hex).
func (r *Registry) PushIndex(t testing.TB, repo, tag string, idx v1.ImageIndex) string {
	t.Helper()
	ref, err := name.NewTag(r.Host+"/"+repo+":"+tag, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatal(err)
	}
	d, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	r.Requests()
	return d.Hex
}

// Entry is one tar entry of a test layer. Type defaults to a regular file
// (a directory when Name ends in "/"); Link is a symlink or hard link
// target.
type Entry struct {
	Name string
	Body string
	Type byte
	Link string
	Mode int64
}

// Layer makes an uncompressed tar of entries, in order.
func Layer(t testing.TB, entries ...Entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.Name, Typeflag: e.Type, Linkname: e.Link, Mode: e.Mode,
			ModTime: time.Unix(1e9, 0), Format: tar.FormatPAX}
		if hdr.Typeflag == 0 {
			hdr.Typeflag = tar.TypeReg
			if strings.HasSuffix(e.Name, "/") {
				hdr.Typeflag = tar.TypeDir
			}
		}
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
			if hdr.Typeflag == tar.TypeDir {
				hdr.Mode = 0o755
			}
		}
		if hdr.Typeflag == tar.TypeReg {
			hdr.Size = int64(len(e.Body))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if hdr.Size > 0 {
			if _, err := tw.Write([]byte(e.Body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Image stacks layers (tar bytes, lowest first) on an empty image, with the
// config's platform set to os/arch when arch is not "".
func Image(t testing.TB, arch string, layers ...[]byte) v1.Image {
	t.Helper()
	var ls []v1.Layer
	for _, b := range layers {
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(b)), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	img, err := mutate.AppendLayers(empty.Image, ls...)
	if err != nil {
		t.Fatal(err)
	}
	if arch != "" {
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture = "linux", arch
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			t.Fatal(err)
		}
	}
	return img
}

// Index makes an image index of imgs, each listed for linux/<arch>.
func Index(t testing.TB, imgs map[string]v1.Image) v1.ImageIndex {
	t.Helper()
	var adds []mutate.IndexAddendum
	for arch, img := range imgs {
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	return mutate.AppendManifests(empty.Index, adds...)
}
