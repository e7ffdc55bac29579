package upgrade

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/artifact"
	"github.com/kubeslot/kubeslot/lib/bundle"
)

// ExecRunner is the real Runner: the program with a minimal environment,
// its stdout returned (bounded), stderr quoted in the error.
type ExecRunner struct{}

// maxOutput bounds what is kept of a program's output.
const maxOutput = 64 << 10

type capped struct{ bytes.Buffer }

func (c *capped) Write(p []byte) (int, error) {
	if room := maxOutput - c.Len(); room > 0 {
		if len(p) > room {
			c.Buffer.Write(p[:room])
		} else {
			c.Buffer.Write(p)
		}
	}
	return len(p), nil
}

// Output implements Runner.
func (ExecRunner) Output(ctx context.Context, path string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	var out, errb capped
	cmd.Stdout, cmd.Stderr = &out, &errb
	// A child that keeps the pipes open must not outlive the bound.
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		tail := errb.String()
		if len(tail) > 200 {
			tail = tail[len(tail)-200:]
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("did not finish within its bound: %w (%q)", err, tail)
		}
		return nil, fmt.Errorf("%w (%q)", err, tail)
	}
	return out.Bytes(), nil
}

// ProcExe is the real Deps.Exe: the target of /proc/<pid>/exe.
func ProcExe(pid uint32) (string, error) {
	return os.Readlink("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/exe")
}

// CacheFetcher is the real Fetcher: lib/artifact's verified, bounded,
// retried download into the content-addressed cache.
type CacheFetcher struct{ F *artifact.Fetcher }

// Fetch implements Fetcher.
func (c CacheFetcher) Fetch(ctx context.Context, source, sha256hex string) (string, error) {
	return c.F.Ensure(ctx, source, sha256hex)
}

// Cached implements Fetcher.
func (c CacheFetcher) Cached(sha256hex string) string {
	p, err := c.F.CachePath(sha256hex)
	if err != nil {
		return ""
	}
	if err := artifact.Verify(p, sha256hex); err != nil {
		return ""
	}
	return p
}

// BundleFiles is the real Bundles: lib/bundle with lim.
type BundleFiles struct{ Limits bundle.Limits }

// Unpack implements Bundles.
func (b BundleFiles) Unpack(ctx context.Context, path, wantSHA256, wantArch, dest string) (*bundle.Manifest, error) {
	return bundle.Unpack(ctx, path, wantSHA256, wantArch, dest, b.Limits)
}

// ReadManifest implements Bundles.
func (BundleFiles) ReadManifest(dir string) (*bundle.Manifest, error) {
	return bundle.ReadManifest(dir)
}

// signatureTimeout bounds the fetch of a bundle's signature.
const signatureTimeout = 30 * time.Second

// FetchSignature reads the detached signature of the bundle at source:
// <source>.minisig, the file beside a bundle given by hand (a path as this
// process sees it, like the bundle) or the same URL with the suffix on its
// path (a query, such as a presigned URL's, stays). Bounded in size and
// time.
func FetchSignature(ctx context.Context, source string) ([]byte, error) {
	if strings.HasPrefix(source, "/") {
		f, err := os.Open(source + bundle.SignatureSuffix)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		return bundle.ReadSignature(f)
	}
	u, err := url.Parse(source)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, fmt.Errorf("bundle source %q: want an absolute path or an http(s) URL", artifact.Redact(source))
	}
	u.Path += bundle.SignatureSuffix
	ctx, cancel := context.WithTimeout(ctx, signatureTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET: %s", resp.Status)
	}
	return bundle.ReadSignature(resp.Body)
}
