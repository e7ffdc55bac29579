package upgrade

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/artifact"
	"github.com/kubeslot/kubeslot/lib/buildinfo"
	"github.com/kubeslot/kubeslot/lib/bundle"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/release"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/stagekit"
	"github.com/kubeslot/kubeslot/lib/systemdconn"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
	"github.com/kubeslot/kubeslot/units"
)

// clock is a fake clock that each wait moves on: the bounds of the
// handover and the health gate pass at once.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) after(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	ch := make(chan time.Time, 1)
	ch <- c.t
	return ch
}

// fakeSystemd models the watcher unit: a restart runs the binary current
// names; a release listed in crash exits at once and is restarted by
// systemd on every read of the unit, one in flaky after a few reads. With
// reexec, a running watcher follows current in place (same PID and
// invocation) on the next read, as the real one does on the link's event.
type fakeSystemd struct {
	mu       sync.Mutex
	t        *testing.T
	root     *hostroot.Root
	reexec   bool
	reexecs  int
	pending  bool // a restart job queued, not yet run
	stopped  []string
	crash    map[string]bool
	flaky    map[string]int // release → reads until its watcher restarts once
	reloads  int
	restarts int
	resets   int
	rel      string // release of the running (or crashing) watcher
	st       systemdconn.ServiceStatus
	exe      map[uint32]string
	inv      int
	reads    int
}

func newFakeSystemd(t *testing.T, root *hostroot.Root) *fakeSystemd {
	return &fakeSystemd{t: t, root: root, crash: map[string]bool{}, flaky: map[string]int{}, exe: map[uint32]string{}}
}

// Reload and RestartUnit fail on a done ctx, as a D-Bus call does.
func (f *fakeSystemd) Reload(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	f.reloads++
	return nil
}

func (f *fakeSystemd) StopUnit(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if name == WatcherUnit {
		f.t.Errorf("the upgrade stopped %s", name)
	}
	f.stopped = append(f.stopped, name)
	return nil
}

func (f *fakeSystemd) ResetFailed(context.Context, string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resets++
	return nil
}

func (f *fakeSystemd) RestartUnit(ctx context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	if name != WatcherUnit {
		f.t.Errorf("restart of %s, want only %s", name, WatcherUnit)
	}
	f.restarts++
	// The job is queued, as with systemd: the next read still shows the
	// invocation being restarted.
	f.pending = true
	return nil
}

// launch starts the watcher through current, as systemd would.
func (f *fakeSystemd) launch() {
	cur, err := release.Current(f.root)
	if err != nil {
		f.t.Errorf("watcher started without current: %v", err)
		return
	}
	f.rel = cur
	f.inv++
	f.reads = 0
	f.st.InvocationID = fmt.Sprintf("%032x", f.inv)
	if f.crash[cur] {
		f.st.ActiveState, f.st.SubState, f.st.MainPID = "activating", "auto-restart", 0
		return
	}
	pid := uint32(1000 + f.inv)
	dir, _ := release.Dir(f.root, cur)
	f.exe[pid] = filepath.Join(dir, "kubeslot-watcher")
	f.st.ActiveState, f.st.SubState, f.st.MainPID = "active", "running", pid
}

func (f *fakeSystemd) ServiceStatus(_ context.Context, name string) (systemdconn.ServiceStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pending {
		f.pending = false
		before := f.st
		f.st.NRestarts = 0
		f.launch()
		if before.InvocationID != "" {
			return before, nil
		}
	}
	if f.st.InvocationID == "" {
		return systemdconn.ServiceStatus{ActiveState: "inactive", SubState: "dead"}, nil
	}
	f.reads++
	if cur, err := release.Current(f.root); err == nil && f.reexec && cur != f.rel && f.st.ActiveState == "active" {
		f.reexecs++
		f.rel, f.reads = cur, 0
		dir, _ := release.Dir(f.root, cur)
		f.exe[f.st.MainPID] = filepath.Join(dir, "kubeslot-watcher")
	}
	switch {
	case f.crash[f.rel], f.flaky[f.rel] > 0 && f.reads == f.flaky[f.rel]:
		f.st.NRestarts++ // Restart=always
		f.launch()
	}
	return f.st, nil
}

// settle runs a queued restart job, as systemd has long done by the time a
// killed upgrader is run again.
func (f *fakeSystemd) settle() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pending {
		f.pending = false
		f.st.NRestarts = 0
		f.launch()
	}
}

func (f *fakeSystemd) exeOf(pid uint32) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := f.exe[pid]; ok {
		return p, nil
	}
	return "", os.ErrNotExist
}

// env is a complete installation in a temp root with release blue
// (version "devel", the manifest the bootstrap writes).
type env struct {
	t     *testing.T
	root  *hostroot.Root
	sd    *fakeSystemd
	d     *Deps
	srv   *httptest.Server
	log   *bytes.Buffer
	clock *clock
}

func newEnv(t *testing.T) *env {
	t.Helper()
	root := testkit.LaidOut(t)
	rec := testhost.Record(t, "host-1", testhost.Sum)
	for _, cp := range ownership.InstallCheckpoints()[1:] {
		if err := rec.SetCheckpoint(cp); err != nil {
			t.Fatal(err)
		}
	}
	if err := ownership.Save(root, rec); err != nil {
		t.Fatal(err)
	}
	src := scripts(t, buildinfo.Version, nil)
	if err := retryBusy(func() error { _, err := release.Ensure(t.Context(), root, src, nil); return err }); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, root: root, sd: newFakeSystemd(t, root), log: &bytes.Buffer{}, clock: &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}}
	e.srv = httptest.NewServer(http.FileServer(http.Dir(t.TempDir())))
	t.Cleanup(e.srv.Close)
	log := slog.New(slog.NewTextHandler(e.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", e.log)
		}
	})
	e.d = &Deps{Root: root, Log: log, Begin: (&stagekit.Driver{Root: root}).Begin, Requests: requests.New(root), Systemd: e.sd,
		Fetcher: CacheFetcher{F: &artifact.Fetcher{Root: root, Log: log, Retries: -1}},
		Bundles: BundleFiles{}, Exec: busyRunner{ExecRunner{}}, Exe: e.sd.exeOf, Arch: buildinfo.Arch,
		// The handover and health gate run on a fake clock that a poll
		// moves on; a hung --version is refused after 1 s of wall time.
		Now: e.clock.now, After: e.clock.after, VersionTimeout: time.Second}
	// The watcher of blue runs.
	if err := e.sd.RestartUnit(t.Context(), WatcherUnit); err != nil {
		t.Fatal(err)
	}
	if _, err := e.sd.ServiceStatus(t.Context(), WatcherUnit); err != nil { // runs the queued job
		t.Fatal(err)
	}
	e.sd.restarts = 0
	return e
}

// scripts writes a directory of shell scripts standing in for the binaries:
// each prints "<name> <version>", unless out overrides what one does.
func scripts(t *testing.T, version string, out map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range bundle.Binaries {
		body := "echo " + name + " " + version
		if o, ok := out[name]; ok {
			body = o
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// bundleOpts change a test bundle.
type bundleOpts struct {
	arch    string
	scripts map[string]string
	// watcherLine is added to the [Service] section of the watcher unit.
	watcherLine string
	// extraUnits are more unit templates (name → content).
	extraUnits map[string]string
}

// makeBundle creates a bundle of version; it returns its path and sha256.
func (e *env) makeBundle(version string, o bundleOpts) (string, string) {
	t := e.t
	t.Helper()
	bin := scripts(t, version, o.scripts)
	udir := t.TempDir()
	for name, data := range o.extraUnits {
		if err := os.WriteFile(filepath.Join(udir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name, data := range units.Templates() {
		if name == units.Watcher && o.watcherLine != "" {
			data = bytes.Replace(data, []byte("[Service]\n"), []byte("[Service]\n"+o.watcherLine+"\n"), 1)
		}
		if err := os.WriteFile(filepath.Join(udir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	arch := o.arch
	if arch == "" {
		arch = buildinfo.Arch
	}
	var buf bytes.Buffer
	if _, err := bundle.Create(&buf, bin, udir, version, arch, time.Time{}); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "kubeslot-"+version+".tar.gz")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p, sum(buf.Bytes())
}

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// serve puts the file at p on the test server and returns its URL.
func (e *env) serve(p string) string {
	e.t.Helper()
	mux := http.NewServeMux()
	data, err := os.ReadFile(p)
	if err != nil {
		e.t.Fatal(err)
	}
	mux.HandleFunc("/b.tar.gz", func(w http.ResponseWriter, r *http.Request) { w.Write(data) })
	e.srv.Config.Handler = mux
	return e.srv.URL + "/b.tar.gz"
}

// request drops an upgrade request as the watcher would.
func (e *env) request(url, sha string) string {
	e.t.Helper()
	r := &requests.Request{Kind: requests.Upgrade, ID: requests.NewID(requests.Upgrade, 7, "up-1"), MachineGeneration: 7,
		Operation: "up-1", Reason: "test", Upgrade: &requests.UpgradeParams{URL: url, SHA256: sha}}
	if _, err := e.d.Requests.Write(r); err != nil {
		e.t.Fatal(err)
	}
	return r.ID
}

func (e *env) job() Job {
	return Job{Triggered: true, HealthWindow: 30 * time.Millisecond, HealthTimeout: 3 * time.Second, LockWait: 2 * time.Second,
		HandoverTimeout: 300 * time.Millisecond}
}

func (e *env) current() string {
	e.t.Helper()
	c, err := release.Current(e.root)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

func (e *env) signal() *requests.UpgradeSignal {
	e.t.Helper()
	s, err := e.d.Requests.ReadUpgradeSignal()
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// installedWatcherUnit is /etc/systemd/system/kubeslot-watcher.service.
func (e *env) installedWatcherUnit() string {
	e.t.Helper()
	p, err := e.root.Resolve("/etc/systemd/system/" + units.Watcher)
	if err != nil {
		e.t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return ""
	}
	return string(b)
}

// currentRuns checks the invariant: current names a release whose
// binaries answer --version.
func (e *env) currentRuns() {
	e.t.Helper()
	if err := retryBusy(func() error { return release.Usable(e.t.Context(), e.root) }); err != nil {
		e.t.Errorf("current is not usable: %v", err)
	}
}

// Tests run in parallel, and a process another test forks while this one
// writes an executable holds the file open for writing until it executes
// its own program: running the file in that moment fails with ETXTBSY ("text
// file busy"). retryBusy calls f again, for that error only.
func retryBusy(f func() error) error {
	for i := 0; ; i++ {
		err := f()
		if err == nil || i == 100 || !strings.Contains(err.Error(), "text file busy") {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// busyRunner runs programs as its Runner does, again while one is busy
// (retryBusy): the upgrader writes the binaries it runs.
type busyRunner struct{ Runner }

func (r busyRunner) Output(ctx context.Context, p string, args ...string) ([]byte, error) {
	var out []byte
	err := retryBusy(func() error {
		var err error
		out, err = r.Runner.Output(ctx, p, args...)
		return err
	})
	return out, err
}
