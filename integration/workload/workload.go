// Package workload gives kubeslot's whole-system tests a pod workload that
// needs no public registry: a tiny static Go program (app/main.go, embedded
// here and compiled at test time), packed into a one-layer image that can be
// pushed to a counting registry on 127.0.0.1 or written as a docker-archive
// tarball for `ctr images import`, and the containerd hosts.toml that puts
// that registry behind a registry name as a plain-HTTP mirror.
//
// The same binary is both the workload and the pod sandbox ("pause")
// process, so a node needs one layer for both: Image runs it as an HTTP
// server on :8080, PauseImage (same layer, other config) as the pause
// process.
//
// This is a test-only helper: only tests under integration/ import it.
package workload

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

//go:embed app/main.go
var appSource []byte

// Greeting is the fixed line that the app's "/" answers after its hostname:
// the body is "<hostname>\n<Greeting>\n".
const Greeting = "kubeslot workload app"

// Port is the TCP port the app serves on in Image's default mode.
const Port = 8080

// App is the workload program built for one architecture.
type App struct {
	// Binary is the static linux/GOARCH executable on this host.
	Binary string
	// GOARCH it was built for.
	GOARCH string
	// BuildTime is how long the go build took; 0 when an earlier build was
	// reused.
	BuildTime time.Duration

	once  sync.Once
	layer v1.Layer
	err   error
}

var (
	buildMu sync.Mutex
	built   = map[string]*App{} // by GOARCH, for this test binary
)

// Build compiles the app for linux/runtime.GOARCH (see BuildArch).
func Build(t testing.TB) *App {
	t.Helper()
	return BuildArch(t, runtime.GOARCH)
}

// BuildArch compiles the app for linux/goarch with CGO_ENABLED=0 and
// -trimpath, and logs how long that took. A test binary builds each
// architecture once; across test binaries the result is kept under the
// user's cache dir ($KUBESLOT_CACHE/workload, default
// ~/.cache/kubeslot/workload), keyed by the source, the Go version and
// goarch, so only a changed app or toolchain builds again. Go's own build
// cache makes such a rebuild a link step.
func BuildArch(t testing.TB, goarch string) *App {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if a := built[goarch]; a != nil {
		return a
	}
	goBin, err := goTool()
	if err != nil {
		t.Fatal(err)
	}
	gover, err := exec.Command(goBin, "env", "GOVERSION").Output()
	if err != nil {
		t.Fatalf("workload: go env GOVERSION: %v", err)
	}
	flags := []string{"build", "-trimpath", "-ldflags=-s -w", "-o"}
	sum := sha256.New()
	fmt.Fprintf(sum, "%s\x00%s\x00%s\x00", strings.TrimSpace(string(gover)), goarch, strings.Join(flags, " "))
	sum.Write(appSource)
	key := hex.EncodeToString(sum.Sum(nil))[:16]

	dir, err := cacheDir()
	keep := err == nil
	if !keep {
		// t.TempDir goes when this test ends: build again for the next one
		t.Logf("workload: no persistent cache (%v); building into this test's temp dir", err)
		dir = t.TempDir()
	}
	bin := filepath.Join(dir, key, "app")
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() {
		t.Logf("workload: reusing app for linux/%s from %s", goarch, bin)
		a := &App{Binary: bin, GOARCH: goarch}
		built[goarch] = a
		return a
	}

	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module kubeslot.test/workload\n\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "main.go"), appSource, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := bin + fmt.Sprintf(".tmp%d", os.Getpid())
	cmd := exec.Command(goBin, append(flags, tmp, ".")...)
	cmd.Dir = src
	// GOFLAGS from the environment (say -mod=vendor) must not reach this
	// stand-alone module; GOWORK likewise.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch, "GOFLAGS=-buildvcs=false", "GOWORK=off")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	if err != nil {
		os.Remove(tmp)
		t.Fatalf("workload: go build of the app for linux/%s: %v\n%s", goarch, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		t.Fatal(err)
	}
	t.Logf("workload: built app for linux/%s in %s (%s)", goarch, took.Round(time.Millisecond), bin)
	a := &App{Binary: bin, GOARCH: goarch, BuildTime: took}
	if keep {
		built[goarch] = a
	}
	return a
}

func goTool() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	// root's PATH under sudo often lacks the toolchain
	const fallback = "/usr/local/go/bin/go"
	if _, err := os.Stat(fallback); err != nil {
		return "", fmt.Errorf("workload: no go toolchain in PATH or at %s", fallback)
	}
	return fallback, nil
}

func cacheDir() (string, error) {
	if c := os.Getenv("KUBESLOT_CACHE"); c != "" {
		return filepath.Join(c, "workload"), nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(base, "kubeslot", "workload"), nil
}

// Layer is the image's one layer: /app (the binary, 0755) and /pause, a
// symlink to it (the app pauses when run under that name). Built once per
// App; its digest depends only on the binary.
func (a *App) Layer(t testing.TB) v1.Layer {
	t.Helper()
	a.once.Do(func() { a.layer, a.err = a.makeLayer() })
	if a.err != nil {
		t.Fatalf("workload: layer of %s: %v", a.Binary, a.err)
	}
	return a.layer
}

func (a *App) makeLayer() (v1.Layer, error) {
	b, err := os.ReadFile(a.Binary)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Unix(1e9, 0)
	for _, h := range []*tar.Header{
		{Name: "app", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(b)), ModTime: mtime},
		{Name: "pause", Typeflag: tar.TypeSymlink, Linkname: "app", Mode: 0o777, ModTime: mtime},
	} {
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(b); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	raw := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(raw)), nil
	}, tarball.WithCompressedCaching)
}

// Image is the workload image: linux/GOARCH, one layer, Entrypoint ["/app"]
// (serve HTTP on :8080), ExposedPorts 8080/tcp. A pod may set args
// ["pause"] to run it as a do-nothing container instead.
func (a *App) Image(t testing.TB) v1.Image {
	t.Helper()
	return a.image(t, []string{"/app"})
}

// PauseImage is the sandbox image: Image's layer with Entrypoint ["/pause"].
// Point containerd's sandbox_image at it (CRI runs the image's Entrypoint
// and Cmd for the sandbox; it cannot pass arguments, hence the second
// config rather than a second mode of the same config).
func (a *App) PauseImage(t testing.TB) v1.Image {
	t.Helper()
	return a.image(t, []string{"/pause"})
}

func (a *App) image(t testing.TB, entrypoint []string) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, a.Layer(t))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", a.GOARCH
	cf.Config.Entrypoint = entrypoint
	cf.Config.Cmd = nil
	cf.Config.WorkingDir = "/"
	cf.Config.Env = []string{"PATH=/"}
	if entrypoint[0] == "/app" {
		cf.Config.ExposedPorts = map[string]struct{}{fmt.Sprintf("%d/tcp", Port): {}}
	}
	// a fixed date keeps the digests the same from run to run
	cf.Created = v1.Time{Time: time.Unix(1e9, 0).UTC()}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}
