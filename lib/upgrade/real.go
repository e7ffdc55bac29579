package upgrade

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
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
