// Package artifact keeps kubeslot's content-addressed artifact cache: the
// rootfs tarball, kubelet, containerd, runc and CNI archives, each named by
// its sha256 under <base>/cache/sha256/<hex>, so a second slot (or a repave)
// never downloads again.
//
// A file in the cache is only ever a verified artifact: it is written to a
// temporary name in the same directory while its sha256 is computed, synced,
// compared with the expected digest and only then renamed into place. A
// cache hit is hashed again before it is used (see Fetcher.Ensure).
//
// Sources are http(s) URLs or absolute host paths (resolved through
// lib/hostroot). Downloads are bounded in size and time, retried with backoff
// on transient failures (network errors, 5xx, 429, truncated or stalled
// bodies) but never on a 4xx or a checksum mismatch, and log progress. URLs
// appear in logs and errors as scheme://host/path only: a query string may
// carry a signature.
//
// Imported by the packages that fetch or verify an artifact (Ensure,
// Verify): lib/bootstrap, the nspawn backend (which builds the repaver's
// slots), lib/kuberelease, lib/oci, lib/upgrade and cmd/kubeslot; and by
// lib/cachekeep (Prune, RemoveStale).
package artifact

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
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// Defaults for the zero values of Fetcher's fields.
const (
	DefaultMaxSize          = 4 << 30          // 4 GiB: a rootfs is a few hundred MB
	DefaultTimeout          = 10 * time.Minute // matches config.DefaultDownload
	DefaultRetries          = 4                // so 5 attempts in all
	DefaultStallTimeout     = time.Minute      // no body bytes for this long: retry
	DefaultProgressInterval = 5 * time.Second
	// MaxBackoff caps the default backoff between attempts.
	MaxBackoff = 30 * time.Second
)

// The cache's directories under <base>/cache. lib/artifact owns the layout:
// lib/oci and the nspawn backend name their directories by these, and Prune
// and RemoveStale know all three.
const (
	// CacheSubdir holds verified files by sha256.
	CacheSubdir = "sha256"
	// OCISubdir holds flattened images and image archives (lib/oci),
	// <digest>-<os>-<arch>.tar[.sha256] and <digest>-<os>-<arch>.image.tar[.sha256].
	OCISubdir = "oci"
	// TreesSubdir holds clean rootfs trees by digest (the nspawn backend).
	TreesSubdir = "trees"
)

// Errors callers may test with errors.Is.
var (
	// ErrChecksum: the content's sha256 is not the expected one. The source
	// is wrong (or tampered with); retrying cannot help.
	ErrChecksum = errors.New("checksum mismatch")
	// ErrTooLarge: the content is larger than Fetcher.MaxSize.
	ErrTooLarge = errors.New("larger than the size bound")
)

// Fetcher ensures artifacts are in the cache. The zero value of every field
// but Root means its default. A Fetcher is safe for concurrent use; two
// Ensure calls for the same digest both download, and the second rename
// replaces the first with identical content.
type Fetcher struct {
	Root *hostroot.Root
	// Client does the HTTP requests; nil means a client over a clone of
	// http.DefaultTransport (30 s dial, 10 s TLS handshake, proxies from the
	// environment) with a 30 s response header timeout. The whole download
	// is bounded by Timeout through the context, not by Client.Timeout.
	Client *http.Client
	Log    *slog.Logger
	// MaxSize bounds an artifact's size in bytes.
	MaxSize int64
	// Timeout bounds one Ensure call, retries and backoff included (config
	// timeouts.download).
	Timeout time.Duration
	// Retries is how many times a transient failure is retried; 0 means
	// DefaultRetries and a negative value means no retry.
	Retries int
	// Backoff gives the wait before retry number attempt (1, 2, ...); nil
	// means exponential from 1 s, capped at MaxBackoff, with jitter.
	Backoff func(attempt int) time.Duration
	// StallTimeout aborts an attempt whose body sends nothing for this long
	// (a transient failure, so it is retried).
	StallTimeout time.Duration
	// ProgressInterval is how often progress is logged during a transfer.
	ProgressInterval time.Duration
}

// Ensure returns the local path of the cached artifact with digest
// sha256hex, fetching it from source first when it is not cached.
//
// A cache hit is hashed again before it is returned rather than trusted
// through a marker: hashing a few hundred MB takes well under a second next
// to unpacking it, and it catches a cache file damaged on disk or changed by
// hand, which a marker would vouch for. A damaged entry is removed and
// fetched again.
//
// On a checksum mismatch nothing is left in the cache and the error (which
// wraps ErrChecksum) names the source, the expected and the actual digest.
func (f *Fetcher) Ensure(ctx context.Context, source, sha256hex string) (string, error) {
	want, err := normalDigest(sha256hex)
	if err != nil {
		return "", fmt.Errorf("artifact %s: %w", Redact(source), err)
	}
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("artifact %s (sha256 %s): %w", Redact(source), want, err)
	}
	src, err := parseSource(source)
	if err != nil {
		return fail(err)
	}
	dst, err := f.CachePath(want)
	if err != nil {
		return fail(err)
	}
	log := f.logger().With("source", Redact(source), "sha256", want)

	switch err := Verify(dst, want); {
	case err == nil:
		log.Info("artifact cache hit", "path", dst)
		return dst, nil
	case errors.Is(err, fs.ErrNotExist):
	default:
		log.Warn("cached artifact is damaged; fetching it again", "path", dst, "err", err)
		if err := atomicfile.Remove(dst); err != nil {
			return fail(fmt.Errorf("remove damaged cache entry %s: %w", dst, err))
		}
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fail(fmt.Errorf("create cache directory: %w", err))
	}

	timeout := f.timeout()
	ctx, cancel := context.WithTimeoutCause(ctx, timeout,
		fmt.Errorf("not finished within %s (timeouts.download): %w", timeout, context.DeadlineExceeded))
	defer cancel()
	if src == nil {
		err = f.copyLocal(ctx, source, want, dst, log)
	} else {
		err = f.download(ctx, src, want, dst, log)
	}
	if err != nil {
		return fail(err)
	}
	return dst, nil
}

// CachePath is the local path of the cache entry for a digest (which need
// not exist).
func (f *Fetcher) CachePath(sha256hex string) (string, error) {
	want, err := normalDigest(sha256hex)
	if err != nil {
		return "", err
	}
	if f.Root == nil {
		return "", errors.New("artifact fetcher has no host root")
	}
	return f.Root.Path(hostroot.CacheDir, CacheSubdir, want)
}

// copyLocal copies a host file into the cache, verifying it on the way.
// Local failures are not transient, so there is no retry.
func (f *Fetcher) copyLocal(ctx context.Context, source, want, dst string, log *slog.Logger) error {
	local, err := f.Root.Resolve(source)
	if err != nil {
		return err
	}
	in, err := os.Open(local)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file", local)
	}
	if fi.Size() > f.maxSize() {
		return fmt.Errorf("%w: %d bytes, bound %d", ErrTooLarge, fi.Size(), f.maxSize())
	}
	log.Info("copying artifact into the cache", "bytes", fi.Size())
	start := time.Now()
	n, err := f.store(ctx, in, fi.Size(), want, dst, log)
	if err != nil {
		return unwrapStore(err)
	}
	logDone(log, "artifact copied into the cache", n, time.Since(start))
	return nil
}

// readError marks a failure reading the source, as opposed to writing the
// cache: only the former may be transient.
type readError struct{ err error }

func (e *readError) Error() string { return e.err.Error() }
func (e *readError) Unwrap() error { return e.err }

func unwrapStore(err error) error {
	var re *readError
	if errors.As(err, &re) {
		return fmt.Errorf("read: %w", re.err)
	}
	return err
}

// store streams r into a temporary file next to dst, hashing it, and renames
// it to dst only when size and digest are right. total is the announced
// size, or -1. On any error the temporary file is removed.
func (f *Fetcher) store(ctx context.Context, r io.Reader, total int64, want, dst string, log *slog.Logger) (n int64, err error) {
	dir := filepath.Dir(dst)
	tmp, err := os.CreateTemp(dir, "."+want+".tmp-*")
	if err != nil {
		return 0, fmt.Errorf("create temporary file in %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	max := f.maxSize()
	h := sha256.New()
	lr := io.LimitReader(r, max+1) // one more byte than allowed detects overflow
	buf := make([]byte, 256<<10)
	every := f.progressInterval()
	last := time.Now()
	for {
		if err := context.Cause(ctx); err != nil {
			return n, &readError{err}
		}
		k, rerr := lr.Read(buf)
		if k > 0 {
			n += int64(k)
			if n > max {
				return n, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, max)
			}
			h.Write(buf[:k])
			if _, err := tmp.Write(buf[:k]); err != nil {
				return n, fmt.Errorf("write %s: %w", tmp.Name(), err)
			}
			if time.Since(last) >= every {
				last = time.Now()
				logProgress(log, n, total)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			if cause := context.Cause(ctx); cause != nil {
				rerr = cause
			}
			return n, &readError{fmt.Errorf("after %d bytes: %w", n, rerr)}
		}
	}
	if total >= 0 && n != total {
		return n, &readError{fmt.Errorf("truncated: got %d of %d bytes", n, total)}
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return n, fmt.Errorf("%w: expected sha256 %s, got %s (%d bytes); nothing was cached", ErrChecksum, want, got, n)
	}
	if err = tmp.Chmod(0o644); err != nil {
		return n, fmt.Errorf("chmod %s: %w", tmp.Name(), err)
	}
	if err = tmp.Sync(); err != nil {
		return n, fmt.Errorf("sync %s: %w", tmp.Name(), err)
	}
	if err = tmp.Close(); err != nil {
		return n, fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	if err = atomicfile.Rename(tmp.Name(), dst); err != nil {
		return n, fmt.Errorf("rename into %s: %w", dst, err)
	}
	return n, nil
}

func logProgress(log *slog.Logger, n, total int64) {
	if total > 0 {
		log.Info("artifact transfer progress", "bytes", n, "total", total, "percent", n*100/total)
		return
	}
	log.Info("artifact transfer progress", "bytes", n)
}

func logDone(log *slog.Logger, msg string, n int64, d time.Duration) {
	mbps := 0.0
	if s := d.Seconds(); s > 0 {
		mbps = float64(n) / s / 1e6
	}
	log.Info(msg, "bytes", n, "duration", d.Round(time.Millisecond), "mb_per_s", fmt.Sprintf("%.1f", mbps))
}

// Verify checks that the file at path has the sha256 digest sha256hex. A
// mismatch wraps ErrChecksum; a missing file wraps fs.ErrNotExist.
func Verify(path, sha256hex string) error {
	want, err := normalDigest(sha256hex)
	if err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("%s: %w: expected sha256 %s, got %s (%d bytes)", path, ErrChecksum, want, got, n)
	}
	return nil
}

// Redact gives a source fit for logs and errors: an URL loses its user
// information, query and fragment (pre-signed URLs carry their signature in
// the query); a local path is returned as is.
func Redact(source string) string {
	if strings.HasPrefix(source, "/") {
		return source
	}
	u, err := url.Parse(source)
	if err != nil || u.Scheme == "" {
		// Not parseable: keep only what precedes any query, so a signature
		// cannot leak through a malformed URL either.
		s, _, _ := strings.Cut(source, "?")
		s, _, _ = strings.Cut(s, "#")
		if i := strings.LastIndex(s, "@"); i >= 0 {
			s = s[i+1:]
		}
		return s
	}
	return u.Scheme + "://" + u.Host + u.EscapedPath()
}

// parseSource returns the URL of an http(s) source, or nil for a local path.
func parseSource(source string) (*url.URL, error) {
	if strings.HasPrefix(source, "/") {
		return nil, nil
	}
	u, err := url.Parse(source)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return nil, errors.New("source must be an http(s) URL or an absolute local path")
	}
	if u.User != nil {
		return nil, errors.New("source URL must not contain credentials")
	}
	return u, nil
}

func normalDigest(s string) (string, error) {
	if len(s) != 64 {
		return "", fmt.Errorf("sha256 %q: want 64 hex digits", s)
	}
	if _, err := hex.DecodeString(s); err != nil {
		return "", fmt.Errorf("sha256 %q: want 64 hex digits", s)
	}
	return strings.ToLower(s), nil
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
