package workload

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kubeslot/kubeslot/lib/oci/ocitest"
)

// Registry is lib/oci/ocitest's in-process registry (plain HTTP on
// 127.0.0.1, stopped when the test ends) with per-repository counters, so
// a test can assert what a node pulled, e.g. that a second pod on the same
// node did not fetch the layer again. Requests made by Push are not
// counted. Query strings are ignored, so it can serve as the mirror of a
// registry name (containerd adds "?ns=<registry-host>" to requests it sends
// to a mirror; see HostsTOML).
type Registry struct {
	// Host is "127.0.0.1:<port>".
	Host string

	inner *ocitest.Registry
	mu    sync.Mutex // orders draining inner's log with pushes
	log   []string   // "METHOD path", every request but pushes'
}

// NewRegistry starts a registry that runs until the test ends.
func NewRegistry(t testing.TB) *Registry {
	t.Helper()
	in := ocitest.NewRegistry(t)
	return &Registry{Host: in.Host, inner: in}
}

// StartRegistry starts a registry for a program that is not a test (the
// rig's demo); Close stops it.
func StartRegistry() *Registry {
	in := ocitest.Start()
	return &Registry{Host: in.Host, inner: in}
}

// Close stops a registry of StartRegistry.
func (r *Registry) Close() { r.inner.Close() }

// MirrorURL is the registry's base URL for a hosts.toml [host] entry:
// "http://127.0.0.1:<port>".
func (r *Registry) MirrorURL() string { return "http://" + r.Host }

// Push stores img as <Host>/repo:tag and returns that reference and the
// manifest digest ("sha256:<hex>"). The pushing requests are not counted.
func (r *Registry) Push(t testing.TB, repo, tag string, img v1.Image) (ref, digest string) {
	t.Helper()
	ref, digest, err := r.PushImage(repo, tag, img)
	if err != nil {
		t.Fatal(err)
	}
	return ref, digest
}

// PushImage is Push outside a test.
func (r *Registry) PushImage(repo, tag string, img v1.Image) (ref, digest string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.drainLocked() // keep what was served before the push
	hex, err := r.inner.PushImage(repo, tag, img)
	if err != nil {
		return "", "", err
	}
	return r.Host + "/" + repo + ":" + tag, "sha256:" + hex, nil
}

func (r *Registry) drainLocked() {
	r.log = append(r.log, r.inner.Requests()...)
}

// Requests returns every request served so far but pushes', "METHOD path"
// in order, e.g. "GET /v2/workload/blobs/sha256:…".
func (r *Registry) Requests() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.drainLocked()
	return append([]string(nil), r.log...)
}

// Reset forgets the requests served so far.
func (r *Registry) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.inner.Requests()
	r.log = nil
}

func (r *Registry) count(method, repo, kind string) int {
	prefix := method + " /v2/" + repo + "/" + kind + "/"
	n := 0
	for _, q := range r.Requests() {
		if strings.HasPrefix(q, prefix) {
			n++
		}
	}
	return n
}

// BlobGETs counts the GETs of repo's blobs (layers and configs).
func (r *Registry) BlobGETs(repo string) int { return r.count("GET", repo, "blobs") }

// ManifestGETs counts the GETs of repo's manifests, by tag or digest.
func (r *Registry) ManifestGETs(repo string) int { return r.count("GET", repo, "manifests") }

// ManifestHEADs counts the HEADs of repo's manifests: containerd resolves
// a tag with a HEAD before it GETs the manifest by digest.
func (r *Registry) ManifestHEADs(repo string) int { return r.count("HEAD", repo, "manifests") }

// WriteArchive writes a docker-archive tarball ("docker save" format, what
// `ctr images import` and `ctr -n k8s.io images import` read) holding each
// image under its reference (e.g. "registry.kubeslot.test/workload:v1"),
// layers shared between images stored once. It returns the file's sha256
// (hex).
func WriteArchive(t testing.TB, path string, images map[string]v1.Image) string {
	t.Helper()
	refs := map[name.Reference]v1.Image{}
	keys := make([]string, 0, len(images))
	for k := range images {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		tag, err := name.NewTag(k, name.StrictValidation)
		if err != nil {
			t.Fatalf("workload: archive reference %q: %v (want host/repo:tag)", k, err)
		}
		refs[tag] = images[k]
	}
	if err := tarball.MultiRefWriteToFile(path, refs); err != nil {
		t.Fatalf("workload: write %s: %v", path, err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}
