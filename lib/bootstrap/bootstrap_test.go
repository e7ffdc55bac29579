package bootstrap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/transition"
	"github.com/kubeslot/kubeslot/units"
)

// fullRun is the call sequence of a fresh bootstrap, each with the
// checkpoint on disk when it was made.
var fullRun = []string{
	"pin@preparing-host",
	"hostprep@preparing-host",
	"provision=a@preparing-slot",
	"configure=a@preparing-slot",
	"start=a@starting-node",
	"healthy=a@starting-node",
	"node-ready@starting-node",
	"release@installing-units",
}

func TestFreshRunPhasesInOrder(t *testing.T) {
	f := newFakes(t)
	cfg := testConfig(t, "worker-1")
	d := f.deps()
	var statuses []string
	d.Status = func(s string) { statuses = append(statuses, s) }
	res, err := Run(t.Context(), d, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// systemd hears each phase as it starts, and the end.
	if len(statuses) != 5 || !strings.HasPrefix(statuses[0], "preparing-host: prepare the host") ||
		!strings.HasPrefix(statuses[3], "installing-units: ") || statuses[4] != "complete: installation "+res.InstallID+", installed" {
		t.Errorf("statuses %q", statuses)
	}
	if got := f.Calls(); !slices.Equal(got, fullRun) {
		t.Errorf("calls:\n got %v\nwant %v", got, fullRun)
	}
	if res.Decision != ownership.Fresh || res.Checkpoint != ownership.CheckpointComplete {
		t.Errorf("result %+v", res)
	}
	want := []ownership.Checkpoint{ownership.CheckpointPreparingHost, ownership.CheckpointPreparingSlot,
		ownership.CheckpointStartingNode, ownership.CheckpointInstallingUnits}
	if !slices.Equal(res.Phases, want) {
		t.Errorf("phases %v, want %v", res.Phases, want)
	}
	rec, err := ownership.Load(f.root)
	if err != nil || rec == nil || rec.Checkpoint != ownership.CheckpointComplete || rec.InstallID != res.InstallID {
		t.Fatalf("record %+v, %v", rec, err)
	}
	// Committed: applied config of slot a, and active.
	a, err := state.NewStore(f.root).ActiveApplied()
	if err != nil || a == nil || a.Slot != "a" || a.Mode != "nspawn" || a.Fingerprint != cfg.Fingerprint() {
		t.Fatalf("active applied %+v, %v", a, err)
	}
	// Units installed, enabled, journalled before they were written.
	all, err := units.All(units.Vars{})
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range all {
		p := filepath.Join(f.root.Prefix(), "etc/systemd/system", name)
		got, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("unit %s not installed: %v", name, err)
		}
		if _, ok := rec.Lookup(ownership.KindUnit, "/etc/systemd/system/"+name); !ok {
			t.Errorf("unit %s not journalled", name)
		}
		for _, link := range installLinks(name, data) {
			if target, err := os.Readlink(filepath.Join(f.root.Prefix(), link)); err != nil || target != "/etc/systemd/system/"+name {
				t.Errorf("unit %s not enabled at %s: %q %v", name, link, target, err)
			}
			if _, ok := rec.Lookup(ownership.KindUnit, link); !ok {
				t.Errorf("enable link %s not journalled", link)
			}
		}
	}
	if _, ok := all[units.Bootstrap]; !ok {
		t.Fatalf("units.All lacks %s", units.Bootstrap)
	}
	// The node starts at host boot, journalled as a unit change.
	link := "/etc/systemd/system/machines.target.wants/systemd-nspawn@a.service"
	if _, err := os.Readlink(filepath.Join(f.root.Prefix(), link)); err != nil {
		t.Errorf("node machine not enabled: %v", err)
	}
	if _, ok := rec.Lookup(ownership.KindUnit, link); !ok {
		t.Errorf("%s not journalled", link)
	}
	if f.sd.Reloads == 0 {
		t.Errorf("no daemon-reload after installing units")
	}
	// Reports: running for each phase, then succeeded.
	var states []string
	for _, r := range f.reports {
		states = append(states, fmt.Sprintf("%s/%s", r.Phase, stateName(r.State)))
	}
	wantStates := []string{"preparing-host/running", "preparing-slot/running", "starting-node/running",
		"installing-units/running", "complete/succeeded"}
	if !slices.Equal(states, wantStates) {
		t.Errorf("reports %v, want %v", states, wantStates)
	}
	// The watcher is started only if this release has its unit.
	_, hasWatcher := all[Watcher]
	if got := slices.Contains(f.started(), Watcher); got != hasWatcher {
		t.Errorf("watcher started %v, unit in release %v", got, hasWatcher)
	}
}

func TestResumeFromEachCheckpoint(t *testing.T) {
	for i, cp := range []ownership.Checkpoint{ownership.CheckpointPreparingHost, ownership.CheckpointPreparingSlot,
		ownership.CheckpointStartingNode, ownership.CheckpointInstallingUnits} {
		t.Run(string(cp), func(t *testing.T) {
			f := newFakes(t)
			cfg := testConfig(t, "worker-1")
			if err := f.root.EnsureLayout(); err != nil {
				t.Fatal(err)
			}
			rec, err := ownership.New(cfg.Machine.Name, cfg.Fingerprint(), "test")
			if err != nil {
				t.Fatal(err)
			}
			if err := rec.SetCheckpoint(cp); err != nil {
				t.Fatal(err)
			}
			if err := ownership.Save(f.root, rec); err != nil {
				t.Fatal(err)
			}
			res, err := Run(t.Context(), f.deps(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if res.Decision != ownership.Resume || res.InstallID != rec.InstallID {
				t.Errorf("decision %v install %s, want resume of %s", res.Decision, res.InstallID, rec.InstallID)
			}
			// The finished phases are skipped: the calls are the tail of a full run from this phase on,
			// after the version check (the kubelet pin) that every run with phases left makes.
			want := []string{"pin@" + string(cp)}
			for _, c := range fullRun[1:] {
				_, at, _ := strings.Cut(c, "@")
				if ownership.Checkpoint(at).Order() > i {
					want = append(want, c)
				}
			}
			if got := f.Calls(); !slices.Equal(got, want) {
				t.Errorf("calls:\n got %v\nwant %v", got, want)
			}
			if res.Phases[0] != cp {
				t.Errorf("first phase run %s, want %s", res.Phases[0], cp)
			}
		})
	}
}

func TestFailedPhaseKeepsCheckpointAndReports(t *testing.T) {
	f := newFakes(t)
	f.failOn = "start=a"
	cfg := testConfig(t, "worker-1")
	_, err := Run(t.Context(), f.deps(), cfg)
	if err == nil || !strings.Contains(err.Error(), "phase starting-node") {
		t.Fatalf("err %v, want a starting-node failure", err)
	}
	rec, _ := ownership.Load(f.root)
	if rec.Checkpoint != ownership.CheckpointStartingNode {
		t.Errorf("checkpoint %s after the failure, want starting-node", rec.Checkpoint)
	}
	if _, found, _ := state.NewStore(f.root).Active(); found {
		t.Errorf("applied/active written although the node never passed verification")
	}
	last := f.reports[len(f.reports)-1]
	c := Condition(last)
	if c.Status != "False" || c.Reason != "StartingNodeFailed" || !strings.Contains(c.Message, "fake start=a failed") {
		t.Errorf("failure condition %+v", c)
	}
	// The re-run resumes at the failed phase with the same installation.
	f.failOn = ""
	f.reset()
	res, err := Run(t.Context(), f.deps(), cfg)
	if err != nil || res.InstallID != rec.InstallID {
		t.Fatalf("re-run: %v, install %s want %s", err, res.InstallID, rec.InstallID)
	}
	if got := f.Calls(); len(got) < 2 || got[0] != "pin@starting-node" || got[1] != "start=a@starting-node" {
		t.Errorf("re-run started with %v", got)
	}
}

func TestCompleteRerunIsNoopAndRepairs(t *testing.T) {
	f := newFakes(t)
	cfg := testConfig(t, "worker-1")
	first, err := Run(t.Context(), f.deps(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range mustUnits(t) {
		if enabled(name, data) && name != units.Bootstrap {
			f.sd.Units[name] = "active"
		}
	}
	before := snapshot(t, f.root.Prefix())
	f.reset()
	t0 := time.Now()
	res, err := Run(t.Context(), f.deps(), cfg)
	t.Logf("complete re-run took %s", time.Since(t0))
	if err != nil {
		t.Fatal(err)
	}
	if res.Decision != ownership.Complete || res.InstallID != first.InstallID || len(res.Repaired) != 0 {
		t.Errorf("re-run %+v", res)
	}
	// Only the boot duties: host preparation and hooks from the applied
	// config (the release is checked by verify, and left alone: it is fine).
	if got := f.Calls(); !slices.Equal(got, []string{"hostprep@complete", "hooks@complete"}) {
		t.Errorf("calls on a complete host: %v", got)
	}
	if f.sd.Reloads != 0 || len(f.started()) != 0 {
		t.Errorf("complete re-run reloaded %d times, started %v", f.sd.Reloads, f.started())
	}
	if diff := testkit.TreeDiff(before, snapshot(t, f.root.Prefix())); diff != "" {
		t.Errorf("complete re-run changed the host:\n%s", diff)
	}

	// A deleted unit file and a removed enable link are back after a re-run.
	unit := filepath.Join(f.root.Prefix(), "etc/systemd/system", units.Bootstrap)
	link := filepath.Join(f.root.Prefix(), "etc/systemd/system/multi-user.target.wants", units.Bootstrap)
	if err := os.Remove(unit); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	f.reset()
	res, err = Run(t.Context(), f.deps(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Repaired) != 2 || f.sd.Reloads != 1 {
		t.Errorf("repaired %v with %d reloads, want the unit and its link, one reload", res.Repaired, f.sd.Reloads)
	}
	if diff := testkit.TreeDiff(before, snapshot(t, f.root.Prefix())); diff != "" {
		t.Errorf("after repair the host differs from the complete install:\n%s", diff)
	}
	// An inactive enabled unit is started (the watcher, once it exists).
	for name, data := range mustUnits(t) {
		if enabled(name, data) && name != units.Bootstrap {
			delete(f.sd.Units, name)
			f.reset()
			if _, err := Run(t.Context(), f.deps(), cfg); err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(f.started(), name) {
				t.Errorf("inactive %s not started by a complete-host run (started %v)", name, f.started())
			}
		}
	}
}

func TestRepairUsesAppliedConfig(t *testing.T) {
	f := newFakes(t)
	cfg := testConfig(t, "worker-1")
	if _, err := Run(t.Context(), f.deps(), cfg); err != nil {
		t.Fatal(err)
	}
	var seen string
	d := f.deps()
	d.NewIsolation = func(c *config.Config, rec *ownership.Record) (isolation.Backend, isolation.Operator, error) {
		seen = c.Fingerprint()
		return fakeBackend{f}, fakeBackend{f}, nil
	}
	// Same fingerprint (the token is not part of it), different secret: the
	// repair must use what was applied, not the new input.
	cfg2 := testConfig(t, "worker-1")
	cfg2.Cluster.BootstrapToken = "zzzzzz.0123456789abcdef"
	if _, err := Run(t.Context(), d, cfg2); err != nil {
		t.Fatal(err)
	}
	a, _ := state.NewStore(f.root).ActiveApplied()
	if seen != a.Fingerprint || a.Config.Cluster.BootstrapToken.Reveal() != "abcdef.0123456789abcdef" {
		t.Errorf("repair built its backend from %s; applied %s", seen, a.Fingerprint)
	}
}

func TestDifferentMachineRefusedHostUntouched(t *testing.T) {
	f := newFakes(t)
	if _, err := Run(t.Context(), f.deps(), testConfig(t, "worker-1")); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, f.root.Prefix())
	f.reset()
	_, err := Run(t.Context(), f.deps(), testConfig(t, "worker-2"))
	if !errors.Is(err, ownership.ErrDifferentInstallation) || exitcode.Of(err) != exitcode.Failure {
		t.Fatalf("err %v (exit %d), want a refusal with exit 1", err, exitcode.Of(err))
	}
	if !strings.Contains(err.Error(), `"worker-1"`) || !strings.Contains(err.Error(), `"worker-2"`) {
		t.Errorf("refusal does not name both machines: %v", err)
	}
	if got := f.Calls(); len(got) != 0 {
		t.Errorf("refused run called %v", got)
	}
	if diff := testkit.TreeDiff(before, snapshot(t, f.root.Prefix())); diff != "" {
		t.Errorf("refused run changed the host:\n%s", diff)
	}
}

func TestResettingRefused(t *testing.T) {
	f := newFakes(t)
	cfg := testConfig(t, "worker-1")
	if _, err := Run(t.Context(), f.deps(), cfg); err != nil {
		t.Fatal(err)
	}
	rec, _ := ownership.Load(f.root)
	_ = rec.SetCheckpoint(ownership.CheckpointResetting)
	if err := ownership.Save(f.root, rec); err != nil {
		t.Fatal(err)
	}
	f.reset()
	if _, err := Run(t.Context(), f.deps(), cfg); !errors.Is(err, ownership.ErrResetInProgress) {
		t.Fatalf("err %v, want reset in progress", err)
	}
	if got := f.Calls(); len(got) != 0 {
		t.Errorf("refused run called %v", got)
	}
}

func TestLockHeldDefers(t *testing.T) {
	f := newFakes(t)
	lock, err := ownership.Acquire(t.Context(), f.root, ownership.Holder{Stage: "kubeslot-repaver"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	cfg := testConfig(t, "worker-1")
	cfg.Timeouts.Lock.Duration = 100 * time.Millisecond // waited out in full: short
	_, err = Run(t.Context(), f.deps(), cfg)
	if exitcode.Of(err) != exitcode.Deferred || !strings.Contains(err.Error(), "kubeslot-repaver") {
		t.Fatalf("err %v (exit %d), want 69 naming the holder", err, exitcode.Of(err))
	}
	if _, err := os.Stat(filepath.Join(f.root.Prefix(), "opt/kubeslot")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("deferred run created the host root: %v", err)
	}
}

func TestPauseHook(t *testing.T) {
	f := newFakes(t)
	d := f.deps()
	ctx, cancel := context.WithCancel(t.Context())
	d.Pause = transition.PauseHook(string(ownership.CheckpointStartingNode), func(string) { cancel() })
	_, err := Run(ctx, d, testConfig(t, "worker-1"))
	if err == nil || !strings.Contains(err.Error(), "paused before starting-node") {
		t.Fatalf("err %v", err)
	}
	if got := f.Calls(); len(got) != 4 || got[3] != "configure=a@preparing-slot" {
		t.Errorf("paused run called %v, want up to configure", got)
	}
	rec, _ := ownership.Load(f.root)
	if rec.Checkpoint != ownership.CheckpointStartingNode {
		t.Errorf("checkpoint %s at the pause, want starting-node written before the phase", rec.Checkpoint)
	}
}

func TestConditionMessageBounded(t *testing.T) {
	c := Condition(Report{Phase: ownership.CheckpointPreparingSlot, State: Failed, Err: errors.New(strings.Repeat("é", 2000))})
	if len(c.Message) > MaxMessage || c.Reason != "PreparingSlotFailed" {
		t.Errorf("message %d bytes, reason %s", len(c.Message), c.Reason)
	}
	if c := Condition(Report{Phase: ownership.CheckpointComplete, State: Succeeded, Slot: "a"}); c.Status != "True" || c.Reason != ReasonSucceeded {
		t.Errorf("success condition %+v", c)
	}
}

func TestMachineFor(t *testing.T) {
	cfg := testConfig(t, "worker-1")
	m := MachineFor(cfg)
	if m.Name != "worker-1" || m.Spec.NodeName != "worker-1" || m.Spec.Node.KubernetesVersion != "1.37.2" ||
		string(m.Spec.Node.RootFS.SHA256) != cfg.RootFS.SHA256 || m.Spec.Node.Artifacts.Kubelet == nil {
		t.Errorf("machine %+v", m)
	}
}

// TestPausable: the test hook pauses before an install checkpoint.
// (The sandbox variables are lib/sandbox's, tested there.)
func TestPausable(t *testing.T) {
	for _, cp := range []ownership.Checkpoint{ownership.CheckpointStartingNode, ownership.CheckpointComplete} {
		if !slices.Contains(Pausable(), string(cp)) {
			t.Errorf("%s: not pausable (%v)", cp, Pausable())
		}
	}
}

func mustUnits(t *testing.T) map[string][]byte {
	all, err := units.All(units.Vars{})
	if err != nil {
		t.Fatal(err)
	}
	return all
}

// snapshot is the tree under dir; the lock file's content says who held
// it last: it is volatile and not part of the comparison.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	return testkit.Tree(t, dir, "run/kubeslot/install.lock")
}

// A slot whose kubelet binary is another release than kubernetes.version
// never commits: the bootstrap fails in starting-node, naming both.
func TestWrongKubeletReleaseNotCommitted(t *testing.T) {
	f := newFakes(t)
	f.kubeletVersion = "1.36.3"
	cfg := testConfig(t, "worker-1")
	_, err := Run(t.Context(), f.deps(), cfg)
	if err == nil || !strings.Contains(err.Error(), "phase starting-node") ||
		!strings.Contains(err.Error(), "reports 1.36.3, but kubernetes version 1.37.2 was asked for") {
		t.Fatalf("err %v, want a starting-node failure naming both versions", err)
	}
	if _, found, _ := state.NewStore(f.root).Active(); found {
		t.Error("applied/active written for a slot that runs another release")
	}
}

// A version the skew policy forbids is refused before anything is
// downloaded, and preflight says so; an API server that cannot be asked
// does not stop the run.
func TestVersionSkewRefusedBeforeDownload(t *testing.T) {
	f := newFakes(t)
	f.serverVersion = "v1.37.2"
	cfg := testConfig(t, "worker-1")
	cfg.Kubernetes.Version = "1.33.4"
	var out strings.Builder
	if err := Preflight(t.Context(), f.deps(), cfg, &out); err == nil || !strings.Contains(out.String(), "kubernetes version: BLOCKED") ||
		!strings.Contains(out.String(), "skew policy") {
		t.Errorf("preflight: %v\n%s", err, out.String())
	}
	_, err := Run(t.Context(), f.deps(), cfg)
	if err == nil || !strings.Contains(err.Error(), "skew policy") || !strings.Contains(err.Error(), "4 minor versions older") {
		t.Fatalf("run: %v, want a refusal naming the skew policy", err)
	}
	for _, c := range f.Calls() {
		if strings.HasPrefix(c, "provision") {
			t.Errorf("provisioned (%s) although the version was refused", c)
		}
	}
	// Unreachable: the run goes on (the wait for the Node bounds it later).
	f2 := newFakes(t)
	if _, err := Run(t.Context(), f2.deps(), testConfig(t, "worker-1")); err != nil {
		t.Errorf("run with the API server unreachable for /version: %v", err)
	}
	var out2 strings.Builder
	_ = Preflight(t.Context(), f2.deps(), testConfig(t, "worker-1"), &out2)
	if !strings.Contains(out2.String(), "API server not reachable to check the skew policy") {
		t.Errorf("preflight without an API server:\n%s", out2.String())
	}
}
