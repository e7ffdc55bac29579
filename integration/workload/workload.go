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
// From a test host (outside its node machine) HostClient and Get reach the
// workload, and a Prober measures how long it stopped answering.
//
// This is a test-only helper: only tests under integration/ and the rig's
// demo program (integration/demo; BuildIn, StartRegistry, HostClient, Get,
// StartProbe) import it.
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
	built   = map[string]*App{} // by build dir and GOARCH, for this process
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
	dir, err := CacheDir()
	keep := err == nil
	if !keep {
		// t.TempDir goes when this test ends: build again for the next one
		t.Logf("workload: no persistent cache (%v); building into this test's temp dir", err)
		dir = t.TempDir()
	}
	a, err := build(dir, goarch, keep, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// BuildIn is BuildArch for a program that is not a test (the rig's demo):
// the build is kept under dir (CacheDir, or a directory of the caller's),
// keyed like BuildArch's, and progress goes to logf.
func BuildIn(dir, goarch string, logf func(format string, args ...any)) (*App, error) {
	return build(dir, goarch, true, logf)
}

// build compiles the app into dir/<key>/app unless it is there already;
// memo keeps the result for this process (dir outlives it).
func build(dir, goarch string, memo bool, logf func(format string, args ...any)) (*App, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	if a := built[dir+"\x00"+goarch]; a != nil {
		return a, nil
	}
	goBin, err := goTool()
	if err != nil {
		return nil, err
	}
	gover, err := exec.Command(goBin, "env", "GOVERSION").Output()
	if err != nil {
		return nil, fmt.Errorf("workload: go env GOVERSION: %w", err)
	}
	flags := []string{"build", "-trimpath", "-ldflags=-s -w", "-o"}
	sum := sha256.New()
	fmt.Fprintf(sum, "%s\x00%s\x00%s\x00", strings.TrimSpace(string(gover)), goarch, strings.Join(flags, " "))
	sum.Write(appSource)
	key := hex.EncodeToString(sum.Sum(nil))[:16]

	bin := filepath.Join(dir, key, "app")
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() {
		logf("workload: reusing app for linux/%s from %s", goarch, bin)
		a := &App{Binary: bin, GOARCH: goarch}
		if memo {
			built[dir+"\x00"+goarch] = a
		}
		return a, nil
	}

	src, err := os.MkdirTemp("", "kubeslot-workload-src-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(src)
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module kubeslot.test/workload\n\ngo 1.22\n"), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(src, "main.go"), appSource, 0o644); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return nil, err
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
		return nil, fmt.Errorf("workload: go build of the app for linux/%s: %w\n%s", goarch, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return nil, err
	}
	logf("workload: built app for linux/%s in %s (%s)", goarch, took.Round(time.Millisecond), bin)
	a := &App{Binary: bin, GOARCH: goarch, BuildTime: took}
	if memo {
		built[dir+"\x00"+goarch] = a
	}
	return a, nil
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

// CacheDir is where builds are kept across processes:
// $KUBESLOT_CACHE/workload, default ~/.cache/kubeslot/workload.
func CacheDir() (string, error) {
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
	return a.mustImage(t, []string{"/app"})
}

// PauseImage is the sandbox image: Image's layer with Entrypoint ["/pause"].
// Point containerd's sandbox_image at it (CRI runs the image's Entrypoint
// and Cmd for the sandbox; it cannot pass arguments, hence the second
// config rather than a second mode of the same config).
func (a *App) PauseImage(t testing.TB) v1.Image {
	t.Helper()
	return a.mustImage(t, []string{"/pause"})
}

// Images returns Image and PauseImage, for a program that is not a test.
func (a *App) Images() (serve, pause v1.Image, err error) {
	if serve, err = a.image([]string{"/app"}); err != nil {
		return nil, nil, err
	}
	if pause, err = a.image([]string{"/pause"}); err != nil {
		return nil, nil, err
	}
	return serve, pause, nil
}

func (a *App) mustImage(t testing.TB, entrypoint []string) v1.Image {
	t.Helper()
	img, err := a.image(entrypoint)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func (a *App) image(entrypoint []string) (v1.Image, error) {
	a.once.Do(func() { a.layer, a.err = a.makeLayer() })
	if a.err != nil {
		return nil, fmt.Errorf("workload: layer of %s: %w", a.Binary, a.err)
	}
	img, err := mutate.AppendLayers(empty.Image, a.layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
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
	return mutate.ConfigFile(img, cf)
}
