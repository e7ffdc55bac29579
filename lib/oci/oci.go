// Package oci pulls a node rootfs given as an OCI image reference
// ("oci://registry/repo[:tag]" with the manifest digest as its sha256) and
// flattens it into one plain tarball in kubeslot's cache, so a slot is then
// built from it exactly like from a rootfs tarball: through lib/unpack and
// all its safety rules. Imported by the nspawn isolation backend (node
// rootfs images) and lib/slot (Resolve, for the sandbox image) only.
//
// What is trusted: the configured digest only. The pull is by digest, never
// by tag (a tag in the source is informational); the manifest's digest is
// checked against the configuration, and go-containerregistry verifies the
// config and every layer blob against the digests the manifest lists. For
// an image index, the child for linux/GOARCH is taken; the index digest is
// the configured one, and it pins the child.
//
// Flattening uses go-containerregistry's mutate.Extract: layers are applied
// top down, whiteouts (".wh.<name>") and opaque directories
// (".wh..wh..opq") hide lower entries, absolute or ".." entry names fail
// the pull, and relative links that climb out of the image are dropped
// (not written). What remains is still untrusted: lib/unpack applies its
// own rules when the tarball is unpacked into a slot.
//
// Registry access is anonymous: no credential is read from the host (no
// docker config, no credential helper is run), so what a slot is built from
// depends on the configuration alone. Plain http is allowed only to a
// loopback registry; every other request must use TLS (a transport wrapper
// refuses http elsewhere, including redirects and go-containerregistry's
// http fallback for private address ranges).
//
// Cache: <base>/cache/oci/<digest>-linux-<arch>.tar with a sidecar
// ".sha256" holding the tarball's own sha256. Both are written (tarball
// first) only after a complete pull; a hit is hashed again before use, and
// a damaged entry is pulled again. So a second slot never pulls.
package oci

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kubeslot/kubeslot/lib/artifact"
	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/oci/ociref"
	"github.com/kubeslot/kubeslot/lib/unpack"
)

// CacheSubdir is the directory under the cache holding flattened images
// (lib/artifact owns the cache's layout and prunes it).
const CacheSubdir = artifact.OCISubdir

// Defaults for the zero values of Fetcher's fields.
const (
	// DefaultMaxSize bounds the flattened tarball (and the sum of the
	// compressed layers): the same bound unpack puts on file content.
	DefaultMaxSize          = unpack.DefaultMaxBytes
	DefaultTimeout          = artifact.DefaultTimeout
	DefaultProgressInterval = artifact.DefaultProgressInterval
)

// Errors callers may test with errors.Is. A digest mismatch wraps
// artifact.ErrChecksum, so callers treat both sources alike.
var (
	ErrTooLarge = artifact.ErrTooLarge
	ErrChecksum = artifact.ErrChecksum
	// ErrPlatform: the image is not for linux on this machine's
	// architecture, or an index has no such child.
	ErrPlatform = errors.New("no image for this platform")
)

// Fetcher ensures flattened images are in the cache. The zero value of
// every field but Root means its default.
type Fetcher struct {
	Root *hostroot.Root
	Log  *slog.Logger
	// Timeout bounds one Ensure call, registry retries included (config
	// timeouts.download).
	Timeout time.Duration
	// MaxSize bounds the flattened tarball in bytes, and the sum of the
	// compressed layer sizes the manifest announces.
	MaxSize int64
	// Transport is the HTTP transport under the TLS guard; nil means
	// go-containerregistry's remote.DefaultTransport.
	Transport http.RoundTripper
	// Arch is the architecture to pick from an index; "" means GOARCH.
	Arch string
	// ProgressInterval is how often flattening progress is logged.
	ProgressInterval time.Duration
}

// Ensure returns the local path of the flattened rootfs tarball of the image
// source (an "oci://" reference) whose manifest (or index) digest is
// sha256hex, pulling it when it is not cached. On any failure nothing is
// left in the cache, and the error names the pinned reference.
func (f *Fetcher) Ensure(ctx context.Context, source, sha256hex string) (string, error) {
	return f.ensure(ctx, source, sha256hex, false)
}

// EnsureArchive is Ensure for an image that containerd imports as it is
// (a preloaded image, not a rootfs): the image as a docker-archive tarball
// tagged with the source's reference, which must carry a tag (what pods
// name it by), cached next to the flattened ones as <digest>-<os>-<arch>.image.tar.
func (f *Fetcher) EnsureArchive(ctx context.Context, source, sha256hex string) (string, error) {
	return f.ensure(ctx, source, sha256hex, true)
}

func (f *Fetcher) ensure(ctx context.Context, source, sha256hex string, archive bool) (string, error) {
	ref, err := ociref.Parse(source, sha256hex)
	if err != nil {
		return "", fmt.Errorf("oci image source: %w", err)
	}
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("oci image %s: %w", ref, err)
	}
	if f.Root == nil {
		return fail(errors.New("oci fetcher has no host root"))
	}
	want := strings.TrimPrefix(ref.Digest.DigestStr(), "sha256:")
	dst, err := f.CachePath(want)
	if err != nil {
		return fail(err)
	}
	var tag name.Tag
	if archive {
		if ref.Tag == "" {
			return fail(errors.New("an image to preload needs a tag in its source (what pods name it by)"))
		}
		if tag, err = name.NewTag(ref.Digest.Context().Name()+":"+ref.Tag, name.StrictValidation); err != nil {
			return fail(err)
		}
		dst = strings.TrimSuffix(dst, ".tar") + ".image.tar"
	}
	log := f.logger().With("image", ref.String(), "platform", f.platform().String())
	if ref.Tag != "" {
		log = log.With("tag", ref.Tag)
	}
	switch err := verifyCached(dst); {
	case err == nil:
		log.Info("image cache hit", "path", dst)
		return dst, nil
	case errors.Is(err, fs.ErrNotExist):
	default:
		log.Warn("cached flattened image is damaged; pulling it again", "path", dst, "err", err)
		if err := removeEntry(dst); err != nil {
			return fail(err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fail(fmt.Errorf("create cache directory: %w", err))
	}

	timeout := f.timeout()
	ctx, cancel := context.WithTimeoutCause(ctx, timeout,
		fmt.Errorf("not finished within %s (timeouts.download): %w", timeout, context.DeadlineExceeded))
	defer cancel()
	start := time.Now()
	img, err := f.pull(ctx, ref, want, log)
	if err != nil {
		return fail(causeOf(ctx, err))
	}
	var stream io.ReadCloser
	what := "flattened"
	if archive {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(tarball.Write(tag, img, pw)) }()
		stream, what = pr, "written as an image archive"
	} else {
		stream = mutate.Extract(img)
	}
	n, err := f.store(ctx, stream, dst, log)
	if err != nil {
		return fail(causeOf(ctx, err))
	}
	log.Info("image pulled and "+what+" into the cache", "path", dst, "bytes", n,
		"duration", time.Since(start).Round(time.Millisecond))
	return dst, nil
}

// CachePath is the local path of the flattened tarball for an image digest
// on this Fetcher's platform (which need not exist).
func (f *Fetcher) CachePath(sha256hex string) (string, error) {
	if f.Root == nil {
		return "", errors.New("oci fetcher has no host root")
	}
	p := f.platform()
	return f.Root.Path(hostroot.CacheDir, CacheSubdir, fmt.Sprintf("%s-%s-%s.tar", strings.ToLower(sha256hex), p.OS, p.Architecture))
}

// pull resolves the pinned reference and checks what it names.
func (f *Fetcher) pull(ctx context.Context, ref ociref.Ref, want string, log *slog.Logger) (v1.Image, error) {
	base := f.Transport
	if base == nil {
		base = remote.DefaultTransport
	}
	opts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuth(authn.Anonymous),
		remote.WithTransport(tlsGuard{base}),
		remote.WithPlatform(f.platform()),
		remote.WithUserAgent("kubeslot"),
	}
	log.Info("pulling image")
	desc, err := remote.Get(ref.Digest, opts...)
	if err != nil {
		return nil, explainGet(err)
	}
	if desc.Digest.Algorithm != "sha256" || desc.Digest.Hex != want {
		return nil, fmt.Errorf("%w: expected manifest sha256 %s, the registry served %s", ErrChecksum, want, desc.Digest)
	}
	var img v1.Image
	switch {
	case desc.MediaType.IsIndex():
		img, err = desc.Image() // the child for WithPlatform
		if err != nil {
			return nil, fmt.Errorf("%w: index %s: %v", ErrPlatform, desc.Digest, err)
		}
		child, err := img.Digest()
		if err != nil {
			return nil, err
		}
		log.Info("image index resolved", "child", child.String())
	case desc.MediaType.IsImage():
		if img, err = desc.Image(); err != nil {
			return nil, err
		}
		got, err := img.Digest()
		if err != nil {
			return nil, err
		}
		if got.Hex != want {
			return nil, fmt.Errorf("%w: expected manifest sha256 %s, got %s", ErrChecksum, want, got)
		}
	default:
		return nil, fmt.Errorf("%s is a %q, not an image or an image index", desc.Digest, desc.MediaType)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	p := f.platform()
	if (cf.OS != "" && cf.OS != p.OS) || (cf.Architecture != "" && cf.Architecture != p.Architecture) {
		return nil, fmt.Errorf("%w: the image is for %s/%s, this host needs %s", ErrPlatform, cf.OS, cf.Architecture, p)
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, err
	}
	var compressed int64
	for _, l := range m.Layers {
		compressed += l.Size
	}
	if compressed > f.maxSize() {
		return nil, fmt.Errorf("%w: %d layers of %d bytes compressed, bound %d", ErrTooLarge, len(m.Layers), compressed, f.maxSize())
	}
	log.Info("image manifest verified", "layers", len(m.Layers), "compressed_bytes", compressed)
	return img, nil
}

// store writes the stream rc (the flattened filesystem, or the image
// archive) to dst via a temporary file, renamed only after the stream ended
// cleanly, then its sidecar.
func (f *Fetcher) store(ctx context.Context, rc io.ReadCloser, dst string, log *slog.Logger) (n int64, err error) {
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".tmp-*")
	if err != nil {
		return 0, fmt.Errorf("create temporary file: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	defer rc.Close() // stops the producing goroutine when we stop early
	h := sha256.New()
	max := f.maxSize()
	lr := io.LimitReader(rc, max+1)
	buf := make([]byte, 256<<10)
	every, last := f.progressInterval(), time.Now()
	for {
		if err := context.Cause(ctx); err != nil {
			return n, err
		}
		k, rerr := lr.Read(buf)
		if k > 0 {
			if n += int64(k); n > max {
				return n, fmt.Errorf("%w: image stream larger than %d bytes", ErrTooLarge, max)
			}
			h.Write(buf[:k])
			if _, err := tmp.Write(buf[:k]); err != nil {
				return n, fmt.Errorf("write %s: %w", tmp.Name(), err)
			}
			if time.Since(last) >= every {
				last = time.Now()
				log.Info("writing image", "bytes", n)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return n, fmt.Errorf("image stream after %d bytes: %w", n, rerr)
		}
	}
	if err = tmp.Chmod(0o644); err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return n, fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err = atomicfile.Rename(tmp.Name(), dst); err != nil {
		return n, err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if err = atomicfile.WriteFile(dst+".sha256", []byte(sum+"\n"), 0o644); err != nil {
		_ = atomicfile.Remove(dst)
		return n, err
	}
	return n, nil
}

// verifyCached checks a cache entry against its sidecar; a missing tarball
// or sidecar wraps fs.ErrNotExist.
func verifyCached(dst string) error {
	b, err := os.ReadFile(dst + ".sha256")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			if _, serr := os.Lstat(dst); serr == nil {
				// A tarball without its sidecar: a crash between the two
				// renames. Not trusted; pulled again.
				return fmt.Errorf("%s has no .sha256 sidecar", dst)
			}
		}
		return err
	}
	return artifact.Verify(dst, strings.TrimSpace(string(b)))
}

func removeEntry(dst string) error {
	for _, p := range []string{dst + ".sha256", dst} {
		if err := atomicfile.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove damaged cache entry %s: %w", p, err)
		}
	}
	return nil
}

// explainGet adds what to check to the common registry answers.
func explainGet(err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		switch te.StatusCode {
		case http.StatusNotFound:
			return fmt.Errorf("%w: the registry has no manifest with this digest; check rootfs.sha256 (the image manifest digest, as `crane digest` prints it) and rootfs.source", err)
		case http.StatusUnauthorized, http.StatusForbidden:
			return fmt.Errorf("%w: pulls are anonymous; the repository must allow anonymous pulls (or be mirrored to one that does)", err)
		}
	}
	return err
}

// causeOf prefers the context's cause (a timeout naming timeouts.download)
// over the transport error it provoked.
func causeOf(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
		return fmt.Errorf("%w (%v)", cause, err)
	}
	return err
}

// tlsGuard refuses plain http to anything but a loopback registry.
type tlsGuard struct{ base http.RoundTripper }

func (g tlsGuard) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Scheme != "https" && !ociref.IsLoopback(r.URL.Hostname()) {
		return nil, fmt.Errorf("refusing %s://%s: registries other than loopback ones must use https", r.URL.Scheme, r.URL.Host)
	}
	return g.base.RoundTrip(r)
}

func (f *Fetcher) platform() v1.Platform {
	arch := f.Arch
	if arch == "" {
		arch = runtime.GOARCH
	}
	return v1.Platform{OS: "linux", Architecture: arch}
}

func (f *Fetcher) logger() *slog.Logger {
	if f.Log != nil {
		return f.Log
	}
	return slog.New(slog.DiscardHandler)
}

func (f *Fetcher) maxSize() int64 {
	if f.MaxSize > 0 {
		return f.MaxSize
	}
	return DefaultMaxSize
}

func (f *Fetcher) timeout() time.Duration {
	if f.Timeout > 0 {
		return f.Timeout
	}
	return DefaultTimeout
}

func (f *Fetcher) progressInterval() time.Duration {
	if f.ProgressInterval > 0 {
		return f.ProgressInterval
	}
	return DefaultProgressInterval
}
