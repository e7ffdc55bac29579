package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostprep"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/release"
	"github.com/kubeslot/kubeslot/lib/stagekit"
	"github.com/kubeslot/kubeslot/lib/systemdconn/sdtest"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
	"github.com/kubeslot/kubeslot/lib/verify/verifytest"
)

// fakes records every call with the checkpoint on disk at that moment, so
// tests see both the order and that each checkpoint was written first.
type fakes struct {
	t    *testing.T
	root *hostroot.Root

	mu      sync.Mutex
	calls   []string
	reports []Report
	sd      *sdtest.Systemd // the host's systemd, with no machines

	failOn string // a call name that fails
	// plan is what the host's Preflight returns (nil: an empty plan).
	plan *hostprep.Plan
	// kubeletVersion is what the slot's kubelet reports ("": 1.37.2);
	// serverVersion the API server's ("": unreachable).
	kubeletVersion string
	serverVersion  string
}

func newFakes(t *testing.T) *fakes {
	root := testkit.Root(t)
	return &fakes{t: t, root: root, sd: sdtest.New(nil)}
}

func (f *fakes) call(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	cp := "none"
	if rec, err := ownership.Load(f.root); err != nil {
		f.t.Errorf("%s: load record: %v", name, err)
	} else if rec != nil {
		cp = string(rec.Checkpoint)
	}
	f.calls = append(f.calls, name+"@"+cp)
	if f.failOn == name {
		return fmt.Errorf("fake %s failed", name)
	}
	return nil
}

func (f *fakes) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *fakes) reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls, f.reports = nil, nil
	f.sd.ForgetCalls()
	f.sd.Reloads = 0
}

// started lists the units started, in order.
func (f *fakes) started() []string {
	var out []string
	for _, c := range f.sd.Calls() {
		if u, ok := strings.CutPrefix(c, "start "); ok {
			out = append(out, u)
		}
	}
	return out
}

func (f *fakes) deps() Deps {
	return Deps{
		Root:    f.root,
		Log:     slog.New(slog.NewTextHandler(f.t.Output(), nil)),
		Begin:   (&stagekit.Driver{Root: f.root}).Begin,
		Host:    fakeHost{f},
		Systemd: f.sd,
		NewIsolation: func(cfg *config.Config, rec *ownership.Record) (isolation.Backend, isolation.Operator, error) {
			if cfg == nil || rec == nil {
				return nil, nil, errors.New("no config or record")
			}
			return fakeBackend{f}, fakeBackend{f}, nil
		},
		Cluster:  fakeCluster{f},
		Releaser: fakeReleaser{f},
		Releases: fakeReleases{f},
	}
}

type fakeHost struct{ f *fakes }

// Preflight changes nothing, so it is not among the calls (a fresh run
// surveys before anything else); it returns f.plan, or an empty one.
func (h fakeHost) Preflight(context.Context, *config.Config) (*hostprep.Plan, error) {
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	if h.f.failOn == "preflight" {
		return nil, errors.New("fake preflight failed")
	}
	if h.f.plan != nil {
		return h.f.plan, nil
	}
	return &hostprep.Plan{}, nil
}
func (h fakeHost) Apply(context.Context, *config.Config, *ownership.Record) error {
	return h.f.call("hostprep")
}

type fakeBackend struct{ f *fakes }

func (b fakeBackend) Provision(_ context.Context, slot string) error {
	return b.f.call("provision=" + slot)
}
func (b fakeBackend) Configure(_ context.Context, slot string) error {
	return b.f.call("configure=" + slot)
}
func (b fakeBackend) Boot(_ context.Context, slot string) error  { return b.f.call("boot=" + slot) }
func (b fakeBackend) Start(_ context.Context, slot string) error { return b.f.call("start=" + slot) }
func (b fakeBackend) Stop(_ context.Context, slot string) error  { return b.f.call("stop=" + slot) }
func (b fakeBackend) Remove(_ context.Context, slot string) error {
	return b.f.call("remove=" + slot)
}
func (b fakeBackend) Exec(context.Context, string, ...string) ([]byte, error) { return nil, nil }
func (b fakeBackend) KubeletVersion(context.Context, string) (string, error) {
	if b.f.kubeletVersion != "" {
		return b.f.kubeletVersion, nil
	}
	return "1.37.2", nil
}

// fakeReleases pins nothing (the test configurations name their kubelet)
// but records the call.
type fakeReleases struct{ f *fakes }

func (r fakeReleases) Pin(context.Context, *config.Config) error { return r.f.call("pin") }

func (b fakeBackend) KubeletStartedAt(context.Context, string) (time.Time, error) {
	return time.Unix(1, 0), nil
}
func (b fakeBackend) KubeletHealthy(_ context.Context, slot string) error {
	return b.f.call("healthy=" + slot)
}
func (b fakeBackend) EnsureHooks(context.Context) error { return b.f.call("hooks") }
func (b fakeBackend) RestartNode(_ context.Context, slot string) (time.Time, error) {
	return time.Now(), b.f.call("restart=" + slot)
}
func (b fakeBackend) Repave(context.Context, string, string) error { return b.f.call("repave") }

type fakeCluster struct{ f *fakes }

// WaitReady answers once the kubelet was seen healthy (the two waits run
// side by side), so that the calls keep one order.
func (c fakeCluster) WaitReady(ctx context.Context, _ *config.Config, _ time.Time) error {
	for !slices.ContainsFunc(c.f.Calls(), func(s string) bool { return strings.HasPrefix(s, "healthy=") }) {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(time.Millisecond):
		}
	}
	return c.f.call("node-ready")
}

// KubeletVersion: the Node reports what the slot's binary is.
func (c fakeCluster) KubeletVersion(ctx context.Context, _ *config.Config) (string, error) {
	return fakeBackend(c).KubeletVersion(ctx, "")
}
func (c fakeCluster) ServerVersion(context.Context, *config.Config) (string, error) {
	if c.f.serverVersion == "" {
		return "", errors.New("connection refused")
	}
	return c.f.serverVersion, nil
}

func (c fakeCluster) Report(_ context.Context, _ *config.Config, r Report) {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	c.f.reports = append(c.f.reports, r)
}

type fakeReleaser struct{ f *fakes }

// Ensure lays a release down in blue (binaries, unit templates, manifest)
// with current and last-good on it, as lib/release.Ensure does, when
// current names no release directory.
func (r fakeReleaser) Ensure(context.Context) error {
	if err := r.f.call("release"); err != nil {
		return err
	}
	if name, err := release.Current(r.f.root); err == nil {
		if dir, err := release.Dir(r.f.root, name); err == nil {
			if _, err := os.Stat(dir); err == nil {
				return nil
			}
		}
	}
	verifytest.Release(r.f.t, r.f.root, release.First, true)
	if err := release.SetCurrent(r.f.root, release.First); err != nil {
		return err
	}
	return release.SetLastGood(r.f.root, release.First)
}

// testConfig is a valid configuration for machine, with short lock and
// node-ready timeouts. Its CA is testkit.SharedCA: a machine's
// configurations have the same fingerprint.
func testConfig(t *testing.T, machine string) *config.Config {
	t.Helper()
	return testhost.Config(t, testhost.Doc{Machine: machine, CA: testkit.SharedCA(), Tables: `
[timeouts]
lock = "1s"
node_ready = "10s"
`})
}
