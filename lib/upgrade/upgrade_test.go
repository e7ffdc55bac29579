package upgrade

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/artifact"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/release"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

const marker = "Environment=KUBESLOT_TEST_MARKER=green"

// lockFile's content says who held the lock last: not a change of the host.
const lockFile = "run/kubeslot/install.lock"

func TestUpgradeByHand(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p, sha := e.makeBundle("2.0", bundleOpts{watcherLine: marker})
	j := e.job()
	j.Triggered, j.Bundle, j.SHA256 = false, p, sha
	res, err := Run(t.Context(), e.d, j)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Outcome != Upgraded || res.FromVersion != "devel" || res.ToVersion != "2.0" || res.FromRelease != "blue" || res.ToRelease != "green" {
		t.Errorf("result %+v", res)
	}
	if c := e.current(); c != "green" {
		t.Errorf("current %s, want green", c)
	}
	if lg, _ := release.LastGood(e.root); lg != "blue" {
		t.Errorf("last-good %s, want blue", lg)
	}
	s := e.signal()
	if s == nil || !s.Verified || s.Failure != "" || s.ToVersion != "2.0" || s.FromVersion != "devel" || !strings.HasPrefix(s.RequestID, "upgrade-0-manual-") {
		t.Fatalf("signal %+v", s)
	}
	names := map[string]bool{}
	for _, p := range s.Phases {
		if names[p.Name] {
			t.Errorf("phase %s recorded twice: %+v", p.Name, s.Phases)
		}
		names[p.Name] = true
	}
	for _, p := range []Phase{Download, Unpack, SmokeTest, Switch, Units, Restart, Health} {
		if !names[string(p)] {
			t.Errorf("signal phases %v lack %s", s.Phases, p)
		}
	}
	if !strings.Contains(e.installedWatcherUnit(), marker) {
		t.Error("the new release's watcher unit was not installed")
	}
	if e.sd.reloads == 0 || e.sd.restarts != 1 {
		t.Errorf("reloads %d restarts %d, want a reload and one restart", e.sd.reloads, e.sd.restarts)
	}
	// After the switch the upgrader never writes a final status.
	if st, err := e.d.Requests.ReadStatus(s.RequestID); err == nil && st.Phase.Finished() {
		t.Errorf("the upgrader wrote the final status %s", st.Phase)
	}
	// The journal holds the unit change, so reset undoes it.
	rec, err := ownership.Load(e.root)
	if err != nil {
		t.Fatal(err)
	}
	if _, found := rec.Lookup(ownership.KindUnit, "/etc/systemd/system/kubeslot-watcher.service"); !found {
		t.Error("the unit file is not in the ownership journal")
	}
	e.currentRuns()
	// Once done, a run finds nothing to do until the watcher reports it.
	if _, err := Run(t.Context(), e.d, e.job()); err != nil {
		t.Errorf("second run: %v", err)
	}
}

func TestUpgradeRequest(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p, sha := e.makeBundle("2.0", bundleOpts{})
	id := e.request(e.serve(p), sha)
	res, err := Run(t.Context(), e.d, e.job())
	if err != nil || res.Outcome != Upgraded {
		t.Fatalf("Run: %+v, %v", res, err)
	}
	if c, _ := e.d.Requests.Claimed(requests.Upgrade); c != nil {
		t.Errorf("claimed request left: %+v", c)
	}
	s := e.signal()
	if s == nil || s.RequestID != id || s.Operation != "up-1" || s.MachineGeneration != 7 || !s.Verified {
		t.Errorf("signal %+v", s)
	}
	st, err := e.d.Requests.ReadStatus(id)
	if err != nil || st.Phase != requests.InProgress || len(st.Phases) == 0 {
		t.Errorf("progress status %+v, %v", st, err)
	}
	// A new request while the finished one is not reported yet waits.
	p2, sha2 := e.makeBundle("3.0", bundleOpts{})
	r := &requests.Request{Kind: requests.Upgrade, ID: "upgrade-8-up-2", MachineGeneration: 8, Operation: "up-2",
		Upgrade: &requests.UpgradeParams{URL: e.serve(p2), SHA256: sha2}}
	if _, err := e.d.Requests.Write(r); err != nil {
		t.Fatal(err)
	}
	if _, err := Run(t.Context(), e.d, e.job()); exitcode.Of(err) != exitcode.Deferred {
		t.Errorf("a new upgrade before the last was reported: %v, want deferred", err)
	}
	// Once the watcher reported it, the next upgrade goes back to blue.
	if err := e.d.Requests.RemoveUpgradeSignal(); err != nil {
		t.Fatal(err)
	}
	res, err = Run(t.Context(), e.d, e.job())
	if err != nil || res.ToRelease != "blue" || res.FromRelease != "green" || e.current() != "blue" {
		t.Fatalf("second upgrade: %+v, %v (current %s)", res, err, e.current())
	}
	if lg, _ := release.LastGood(e.root); lg != "green" {
		t.Errorf("last-good %s, want green (the release that ran)", lg)
	}
	// The first upgrade's bundle went at the second run's start: no request names it any
	// more, and installed releases use nothing in the cache. A third run removes a killed download's temporary
	// file and the second bundle, whose request is finished too.
	cache, err := e.root.Path(hostroot.CacheDir, artifact.CacheSubdir)
	if err != nil {
		t.Fatal(err)
	}
	left := func() []string {
		ents, _ := os.ReadDir(cache)
		var out []string
		for _, en := range ents {
			out = append(out, en.Name())
		}
		return out
	}
	if got := left(); !slices.Equal(got, []string{sha2}) {
		t.Errorf("cache after the second upgrade: %v, want only its bundle %s (the first, %s, pruned)", got, sha2, sha)
	}
	if err := os.WriteFile(filepath.Join(cache, "."+sha2+".tmp-5"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Run(t.Context(), e.d, e.job()); err != nil && exitcode.Of(err) != exitcode.Deferred {
		t.Fatalf("third run: %v", err)
	}
	if got := left(); len(got) != 0 {
		t.Errorf("cache after a third run: %v, want nothing", got)
	}
}

func TestNothingToDo(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	res, err := Run(t.Context(), e.d, e.job())
	if err != nil || res.Outcome != Nothing {
		t.Errorf("triggered with no request: %+v, %v", res, err)
	}
	j := e.job()
	j.Triggered = false
	if _, err := Run(t.Context(), e.d, j); exitcode.Of(err) != exitcode.Usage {
		t.Errorf("by hand without --bundle: %v, want a usage error", err)
	}
}

func TestDeferred(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	l, err := ownership.Acquire(t.Context(), e.root, ownership.Holder{Stage: "test"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	j := e.job()
	j.LockWait = 100 * time.Millisecond
	if _, err := Run(t.Context(), e.d, j); exitcode.Of(err) != exitcode.Deferred {
		t.Errorf("lock held: %v, want deferred", err)
	}
	if _, err := Recover(t.Context(), e.d, j); exitcode.Of(err) != exitcode.Deferred {
		t.Errorf("recover, lock held: %v, want deferred", err)
	}
	l.Release()
	rec, _ := ownership.Load(e.root)
	rec.Checkpoint = ownership.CheckpointInstallingUnits
	if err := ownership.Save(e.root, rec); err != nil {
		t.Fatal(err)
	}
	if _, err := Run(t.Context(), e.d, j); exitcode.Of(err) != exitcode.Deferred || !strings.Contains(err.Error(), "not complete") {
		t.Errorf("incomplete installation: %v, want deferred", err)
	}
}

// unsafeBundle is a gzip tar with a ../ entry.
func unsafeBundle(t *testing.T) string {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	body := []byte("x")
	tw.WriteHeader(&tar.Header{Name: "../escape", Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
	tw.Write(body)
	tw.Close()
	gz.Close()
	p := filepath.Join(t.TempDir(), "unsafe.tar.gz")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPreSwitchFaultsRefused: every fault before the switch fails the
// request with the reason, switches nothing and leaves no release behind.
func TestPreSwitchFaultsRefused(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// make returns the bundle path, the sha256 to ask for, and whether
		// to serve it (a request) rather than use it by hand.
		make func(e *env) (string, string, bool)
		want string
	}{
		{"checksum mismatch", func(e *env) (string, string, bool) {
			p, _ := e.makeBundle("2.0", bundleOpts{})
			return p, strings.Repeat("0", 64), true
		}, "checksum"},
		{"truncated download", func(e *env) (string, string, bool) {
			p, sha := e.makeBundle("2.0", bundleOpts{})
			b, _ := os.ReadFile(p)
			os.WriteFile(p, b[:len(b)/2], 0o644)
			return p, sha, true
		}, "checksum"},
		{"truncated file by hand", func(e *env) (string, string, bool) {
			p, _ := e.makeBundle("2.0", bundleOpts{})
			b, _ := os.ReadFile(p)
			os.WriteFile(p, b[:len(b)/2], 0o644)
			return p, "", false
		}, "bundle"},
		{"unsafe tar", func(e *env) (string, string, bool) { return unsafeBundle(e.t), "", false }, "escape"},
		{"other architecture", func(e *env) (string, string, bool) {
			p, sha := e.makeBundle("2.0", bundleOpts{arch: otherArch()})
			return p, sha, true
		}, otherArch()},
		{"binary does not run", func(e *env) (string, string, bool) {
			p, sha := e.makeBundle("2.0", bundleOpts{scripts: map[string]string{"kubeslot-repaver": "exit 3"}})
			return p, sha, false
		}, "kubeslot-repaver"},
		{"binary hangs", func(e *env) (string, string, bool) {
			p, sha := e.makeBundle("2.0", bundleOpts{scripts: map[string]string{"kubeslot-resetter": "exec sleep 30"}})
			return p, sha, false
		}, "kubeslot-resetter"},
		{"version mismatch", func(e *env) (string, string, bool) {
			p, sha := e.makeBundle("2.0", bundleOpts{scripts: map[string]string{"kubeslot-watcher": "echo kubeslot-watcher 1.9"}})
			return p, sha, true
		}, `"kubeslot-watcher 1.9"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			p, sha, served := c.make(e)
			j := e.job()
			var id string
			if served {
				id = e.request(e.serve(p), sha)
			} else {
				j.Triggered, j.Bundle, j.SHA256 = false, p, sha
			}
			t0 := time.Now()
			res, err := Run(t.Context(), e.d, j)
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want ErrRefused naming %q", err, c.want)
			}
			t.Logf("figure refused %s in %s", c.name, time.Since(t0).Round(time.Millisecond))
			if res == nil || res.Outcome != Refused {
				t.Errorf("result %+v", res)
			}
			if id == "" {
				id = res.RequestID
			}
			st, err := e.d.Requests.ReadStatus(id)
			if err != nil || st.Phase != requests.Failed || !strings.Contains(st.Message, c.want) {
				t.Errorf("status %+v, %v: want Failed naming %q", st, err, c.want)
			}
			if e.current() != "blue" {
				t.Errorf("current %s, want blue", e.current())
			}
			if _, err := os.Stat(filepath.Join(e.root.Prefix(), "opt/kubeslot/releases/green")); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("half-made release left: %v", err)
			}
			if s := e.signal(); s != nil {
				t.Errorf("signal left: %+v", s)
			}
			if c, _ := e.d.Requests.Claimed(requests.Upgrade); c != nil {
				t.Errorf("claimed request left")
			}
			if e.sd.restarts != 0 {
				t.Errorf("the watcher was restarted %d times", e.sd.restarts)
			}
			e.currentRuns()
		})
	}
}

func otherArch() string {
	if runtime.GOARCH == "arm64" {
		return "amd64"
	}
	return "arm64"
}

func TestRollbackUnhealthyWatcher(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		set  func(sd *fakeSystemd)
		want string
	}{
		{"exits at once", func(sd *fakeSystemd) { sd.crash["green"] = true }, "exited"},
		{"restarted", func(sd *fakeSystemd) { sd.flaky["green"] = 2 }, "was restarted 1 times"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			c.set(e.sd)
			p, sha := e.makeBundle("2.0", bundleOpts{watcherLine: marker})
			id := e.request(e.serve(p), sha)
			j := e.job()
			j.HealthWindow = 300 * time.Millisecond
			res, err := Run(t.Context(), e.d, j)
			if !errors.Is(err, ErrRolledBack) {
				t.Fatalf("err %v, want ErrRolledBack", err)
			}
			t.Logf("figure rollback (%s) %s after the switch", c.name, res.RolledBack.Round(time.Millisecond))
			if e.current() != "blue" {
				t.Errorf("current %s, want blue", e.current())
			}
			s := e.signal()
			want := "new watcher 2.0 " + c.want
			if s == nil || s.RequestID != id || s.Verified || !strings.Contains(s.Failure, want) || !strings.Contains(s.Failure, "rolled back to devel") {
				t.Errorf("signal %+v, want Failure %q ... rolled back to devel", s, want)
			}
			if strings.Contains(e.installedWatcherUnit(), marker) {
				t.Error("the new release's unit is still installed")
			}
			if c, _ := e.d.Requests.Claimed(requests.Upgrade); c != nil {
				t.Error("claimed request left")
			}
			if st, err := e.d.Requests.ReadStatus(id); err == nil && st.Phase.Finished() {
				t.Errorf("the upgrader wrote the final status %s after the switch", st.Phase)
			}
			if e.sd.rel != "blue" || e.sd.st.ActiveState != "active" {
				t.Errorf("watcher runs %s (%s), want blue active", e.sd.rel, e.sd.st.ActiveState)
			}
			e.currentRuns()
		})
	}
}

// TestResumeAfterInterruption kills the run (the pause hook) before each
// phase (the rollback when the new watcher is bad), then runs again: the
// upgrade completes, or rolls back when the new watcher is bad, and current
// always names a release that runs.
func TestResumeAfterInterruption(t *testing.T) {
	t.Parallel()
	for _, bad := range []bool{false, true} {
		phases := []Phase{Preflight, Download, LastGood, Unpack, SmokeTest, Signal, Switch, Units, Restart, Health}
		if bad {
			phases = append(phases, Rollback)
		}
		for _, at := range phases {
			name := string(at)
			if bad {
				name += "/bad watcher"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t)
				e.sd.crash["green"] = bad
				p, sha := e.makeBundle("2.0", bundleOpts{watcherLine: marker})
				id := e.request(e.serve(p), sha)
				crash := errors.New("killed")
				e.d.Pause = func(_ context.Context, p string) error {
					if p == string(at) {
						return crash
					}
					return nil
				}
				if _, err := Run(t.Context(), e.d, e.job()); !errors.Is(err, crash) {
					t.Fatalf("first run: %v, want the crash", err)
				}
				e.sd.settle()
				e.currentRuns()
				if st, err := e.d.Requests.ReadStatus(id); err == nil && st.Phase == requests.Failed {
					t.Fatalf("the interruption was recorded as a failure: %+v", st)
				}
				e.d.Pause = nil
				res, err := Run(t.Context(), e.d, e.job())
				switch {
				case bad && !errors.Is(err, ErrRolledBack), !bad && err != nil:
					t.Fatalf("resumed run: %+v, %v", res, err)
				}
				want := "green"
				if bad {
					want = "blue"
				}
				if e.current() != want {
					t.Errorf("current %s, want %s", e.current(), want)
				}
				s := e.signal()
				if s == nil || s.RequestID != id || s.Verified == bad || (s.Failure != "") != bad {
					t.Errorf("signal %+v", s)
				}
				if c, _ := e.d.Requests.Claimed(requests.Upgrade); c != nil {
					t.Error("claimed request left")
				}
				e.currentRuns()
			})
		}
	}
}

// TestStopIsNotFailure: a run told to stop (SIGTERM) in a phase after the
// switch (its systemd call fails on the done ctx) neither rolls back nor
// records a failure; the next run finishes the upgrade.
func TestStopIsNotFailure(t *testing.T) {
	t.Parallel()
	for _, at := range []Phase{Units, Restart} {
		t.Run(string(at), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			p, sha := e.makeBundle("2.0", bundleOpts{watcherLine: marker})
			id := e.request(e.serve(p), sha)
			ctx, cancel := context.WithCancel(t.Context())
			e.d.Pause = func(_ context.Context, p string) error {
				if p == string(at) {
					cancel() // the phase then runs with ctx done
				}
				return nil
			}
			res, err := Run(ctx, e.d, e.job())
			if !errors.Is(err, context.Canceled) || errors.Is(err, ErrRolledBack) || res != nil {
				t.Fatalf("stopped run: %+v, %v; want an interruption", res, err)
			}
			if !slices.ContainsFunc(strings.Split(e.log.String(), "\n"), func(l string) bool {
				return strings.Contains(l, "upgrade phase failed") && strings.Contains(l, "phase="+string(at)+" ") && strings.Contains(l, "stopped=true")
			}) {
				t.Errorf("the log does not show %s stopped", at)
			}
			if s := e.signal(); s == nil || s.Failure != "" || s.Verified {
				t.Errorf("signal after the stop %+v, want neither failed nor verified", s)
			}
			if e.current() != "green" {
				t.Errorf("current %s after the stop, want green (switched, not rolled back)", e.current())
			}
			if st, err := e.d.Requests.ReadStatus(id); err == nil && st.Phase == requests.Failed {
				t.Errorf("the stop was recorded as a failure: %+v", st)
			}
			e.d.Pause = nil
			e.sd.settle()
			if res, err := Run(t.Context(), e.d, e.job()); err != nil || res.Outcome != Upgraded {
				t.Fatalf("resumed run: %+v, %v", res, err)
			}
		})
	}
}

func TestRecoverIdempotent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p, sha := e.makeBundle("2.0", bundleOpts{watcherLine: marker})
	e.request(e.serve(p), sha)
	if _, err := Run(t.Context(), e.d, e.job()); err != nil {
		t.Fatal(err)
	}
	// The new watcher starts crashing after the upgrader is gone.
	e.sd.crash["green"] = true
	restarts := e.sd.restarts
	res, err := Recover(t.Context(), e.d, e.job())
	if err != nil || res.Outcome != Recovered {
		t.Fatalf("Recover: %+v, %v", res, err)
	}
	if e.current() != "blue" {
		t.Errorf("current %s, want blue", e.current())
	}
	s := e.signal()
	if s == nil || s.Verified || !strings.Contains(s.Failure, "the new watcher 2.0 kept failing after the upgrade; recovered to devel") {
		t.Errorf("signal %+v", s)
	}
	if strings.Contains(e.installedWatcherUnit(), marker) {
		t.Error("the failing release's unit is still installed")
	}
	if e.sd.restarts != restarts+1 || e.sd.resets == 0 {
		t.Errorf("restarts %d (before %d), resets %d: want reset-failed and one restart", e.sd.restarts, restarts, e.sd.resets)
	}
	// Again (OnFailure= runs on every failure): nothing changes.
	first := s.Failure
	res, err = Recover(t.Context(), e.d, e.job())
	if err != nil || res.Outcome != Nothing {
		t.Errorf("second Recover: %+v, %v", res, err)
	}
	if e.sd.restarts != restarts+1 {
		t.Error("the second recovery restarted the watcher")
	}
	if s := e.signal(); s == nil || s.Failure != first {
		t.Errorf("signal changed by the second recovery: %+v", s)
	}
	e.currentRuns()
}

func TestRecoverWithoutSignalAndWithBrokenLastGood(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p, sha := e.makeBundle("2.0", bundleOpts{})
	e.request(e.serve(p), sha)
	if _, err := Run(t.Context(), e.d, e.job()); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Requests.RemoveUpgradeSignal(); err != nil {
		t.Fatal(err)
	}
	// A last-good release whose binaries do not run is never switched to.
	blue, _ := release.Dir(e.root, "blue")
	os.WriteFile(filepath.Join(blue, "kubeslot-watcher"), []byte("#!/bin/sh\nexit 1\n"), 0o755)
	if _, err := Recover(t.Context(), e.d, e.job()); err == nil || e.current() != "green" {
		t.Errorf("recover to a broken last-good: %v, current %s", err, e.current())
	}
	os.WriteFile(filepath.Join(blue, "kubeslot-watcher"), []byte("#!/bin/sh\necho kubeslot-watcher devel\n"), 0o755)
	if res, err := Recover(t.Context(), e.d, e.job()); err != nil || e.current() != "blue" || res.Outcome != Recovered {
		t.Errorf("recover: %+v, %v, current %s", res, err, e.current())
	}
	if s := e.signal(); s != nil {
		t.Errorf("a signal was made up: %+v", s)
	}
}

// A release reported Succeeded and still on probation (the watcher wrote the
// file and removed the signal) is rolled back by the recovery unit, and the
// rollback is recorded in the probation file for the recovered watcher to
// publish. The next upgrade ends a probation that was not rolled back.
func TestRecoverOnProbation(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p, sha := e.makeBundle("2.0", bundleOpts{})
	e.request(e.serve(p), sha)
	if _, err := Run(t.Context(), e.d, e.job()); err != nil {
		t.Fatal(err)
	}
	sig := e.signal()
	if sig == nil || !sig.Verified {
		t.Fatalf("signal %+v", sig)
	}
	// The new watcher's verdict: probation written, signal removed.
	prob := &requests.Probation{RequestID: sig.RequestID, Operation: sig.Operation, FromRelease: sig.FromRelease,
		FromVersion: sig.FromVersion, ToRelease: sig.ToRelease, ToVersion: sig.ToVersion, SucceededAt: time.Now().UTC()}
	if err := e.d.Requests.WriteProbation(prob); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Requests.RemoveUpgradeSignal(); err != nil {
		t.Fatal(err)
	}
	e.sd.crash["green"] = true
	if res, err := Recover(t.Context(), e.d, e.job()); err != nil || res.Outcome != Recovered || e.current() != "blue" {
		t.Fatalf("Recover: %+v, %v, current %s", res, err, e.current())
	}
	got, err := e.d.Requests.ReadProbation()
	if err != nil || got == nil || got.RolledBackAt.IsZero() || !strings.Contains(got.Reason, "failed on probation") ||
		!strings.Contains(got.Reason, "current back at devel") {
		t.Fatalf("probation after the recovery: %+v %v", got, err)
	}
	if s := e.signal(); s != nil {
		t.Errorf("a signal was made up: %+v", s)
	}
	// Again: nothing changes.
	first := *got
	if res, err := Recover(t.Context(), e.d, e.job()); err != nil || res.Outcome != Nothing {
		t.Errorf("second Recover: %+v, %v", res, err)
	}
	if again, _ := e.d.Requests.ReadProbation(); again == nil || again.Reason != first.Reason || !again.RolledBackAt.Equal(first.RolledBackAt) {
		t.Errorf("probation changed by the second recovery: %+v", again)
	}
}

// The next upgrade's last-good phase ends a probation of the running release,
// but keeps a rollback that is not published yet.
func TestLastGoodEndsProbation(t *testing.T) {
	t.Parallel()
	for _, rolledBack := range []bool{false, true} {
		e := newEnv(t)
		prob := &requests.Probation{RequestID: "upgrade-1-u0", FromRelease: "green", FromVersion: "1.0", ToRelease: "blue", ToVersion: "devel",
			SucceededAt: time.Now().UTC()}
		if rolledBack {
			prob.Reason = "failed on probation"
		}
		if err := e.d.Requests.WriteProbation(prob); err != nil {
			t.Fatal(err)
		}
		p, sha := e.makeBundle("2.0", bundleOpts{})
		e.request(e.serve(p), sha)
		if _, err := Run(t.Context(), e.d, e.job()); err != nil {
			t.Fatal(err)
		}
		got, err := e.d.Requests.ReadProbation()
		if err != nil || (got != nil) != rolledBack {
			t.Errorf("rolled back %v: probation after the next upgrade %+v %v", rolledBack, got, err)
		}
	}
}

func TestPreflightChangesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p, sha := e.makeBundle("2.0", bundleOpts{watcherLine: marker})
	before := testkit.Tree(t, e.root.Prefix(), lockFile)
	plan, err := PreflightPlan(t.Context(), e.d, Job{Bundle: p, SHA256: sha})
	if err != nil {
		t.Fatal(err)
	}
	if plan.FromVersion != "devel" || plan.ToVersion != "2.0" || plan.ToRelease != "green" {
		t.Errorf("plan %+v", plan)
	}
	found := false
	for _, u := range plan.UnitChanges {
		found = found || u == "/etc/systemd/system/kubeslot-watcher.service"
	}
	if !found {
		t.Errorf("unit changes %v lack the watcher unit", plan.UnitChanges)
	}
	if diff := testkit.TreeDiff(before, testkit.Tree(t, e.root.Prefix(), lockFile)); diff != "" {
		t.Errorf("preflight changed the host root:\n%s", diff)
	}
	var buf bytes.Buffer
	plan.WriteText(&buf)
	if !strings.Contains(buf.String(), "devel (release blue) -> 2.0 (release green)") {
		t.Errorf("text plan:\n%s", buf.String())
	}
	// A request whose bundle is not downloaded yet: the version is unknown.
	e.request(e.serve(p), sha)
	plan, err = PreflightPlan(t.Context(), e.d, Job{})
	if err != nil || plan.ToVersion != "" || plan.RequestID == "" {
		t.Errorf("plan of a request: %+v, %v", plan, err)
	}
}

func TestHandover(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name        string
		reexec      bool
		watcherLine string
		crash       bool
		flaky       int
		restarts    int
		outcome     string
	}{
		// The watcher follows current: same PID, no restart.
		{name: "re-executed in place", reexec: true, outcome: Upgraded},
		// A watcher that does not re-execute (a release from before) is
		// restarted after the handover bound.
		{name: "no re-exec", restarts: 1, outcome: Upgraded},
		// A changed unit file takes effect only on a start.
		{name: "unit changed", reexec: true, watcherLine: marker, restarts: 1, outcome: Upgraded},
		// A re-executed watcher restarted by systemd once it was seen
		// running: the gate counts that, the rollback restarts the old one.
		{name: "re-executed then restarted", reexec: true, flaky: 2, restarts: 1, outcome: RolledBack},
		// One that crashes before it is seen running is restarted (the
		// fallback), then rolled back.
		{name: "re-executed then crashes", reexec: true, crash: true, restarts: 2, outcome: RolledBack},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.sd.reexec, e.sd.crash["green"], e.sd.flaky["green"] = c.reexec, c.crash, c.flaky
			e.sd.mu.Lock()
			pid := e.sd.st.MainPID
			e.sd.mu.Unlock()
			p, sha := e.makeBundle("2.0", bundleOpts{watcherLine: c.watcherLine})
			e.request(e.serve(p), sha)
			res, err := Run(t.Context(), e.d, e.job())
			if res == nil || res.Outcome != c.outcome {
				t.Fatalf("Run: %+v, %v; want outcome %s", res, err, c.outcome)
			}
			e.sd.mu.Lock()
			defer e.sd.mu.Unlock()
			if e.sd.restarts != c.restarts {
				t.Errorf("unit restarts %d, want %d", e.sd.restarts, c.restarts)
			}
			if c.restarts == 0 && e.sd.st.MainPID != pid {
				t.Errorf("MainPID %d -> %d, want the same process", pid, e.sd.st.MainPID)
			}
			if c.outcome == RolledBack && !strings.Contains(res.Message, "was restarted") && !strings.Contains(res.Message, "exited") {
				t.Errorf("rollback message %q does not say why", res.Message)
			}
		})
	}
}

// TestDroppedUnits: a unit the new release no longer has is stopped and
// removed with its enable link; a rollback removes what the failed release
// added.
func TestDroppedUnits(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.sd.reexec = true
	extra := map[string]string{"kubeslot-extra.service": "[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n"}
	exists := func(p string) bool {
		l, err := e.root.Resolve(p)
		if err != nil {
			t.Fatal(err)
		}
		_, err = os.Lstat(l)
		return err == nil
	}
	const file, link = "/etc/systemd/system/kubeslot-extra.service", "/etc/systemd/system/multi-user.target.wants/kubeslot-extra.service"
	n := 0
	run := func(version string, o bundleOpts) (*Result, error) {
		t.Helper()
		p, sha := e.makeBundle(version, o)
		n++
		op := fmt.Sprintf("up-%d", n)
		r := &requests.Request{Kind: requests.Upgrade, ID: requests.NewID(requests.Upgrade, 7, op), MachineGeneration: 7,
			Operation: op, Reason: "test", Upgrade: &requests.UpgradeParams{URL: e.serve(p), SHA256: sha}}
		if _, err := e.d.Requests.Write(r); err != nil {
			t.Fatal(err)
		}
		res, err := Run(t.Context(), e.d, e.job())
		if err == nil {
			if err := e.d.Requests.RemoveUpgradeSignal(); err != nil { // the watcher reported it
				t.Fatal(err)
			}
		}
		return res, err
	}
	if _, err := run("2.0", bundleOpts{extraUnits: extra}); err != nil {
		t.Fatal(err)
	}
	if !exists(file) || !exists(link) {
		t.Fatal("the release's extra unit was not installed and enabled")
	}
	// 3.0 drops it.
	if _, err := run("3.0", bundleOpts{}); err != nil {
		t.Fatal(err)
	}
	if exists(file) || exists(link) {
		t.Error("the dropped unit's file or link is left")
	}
	if !slices.Contains(e.sd.stopped, "kubeslot-extra.service") {
		t.Errorf("stopped %v, want the dropped unit stopped first", e.sd.stopped)
	}
	// 4.0 adds it again but its watcher crashes: the rollback takes it away.
	inactive, err := release.Inactive(e.root)
	if err != nil {
		t.Fatal(err)
	}
	e.sd.crash[inactive] = true
	if _, err := run("4.0", bundleOpts{extraUnits: extra}); !errors.Is(err, ErrRolledBack) {
		t.Fatalf("4.0: %v, want a rollback", err)
	}
	if exists(file) || exists(link) {
		t.Error("the rolled-back release's unit is left")
	}
	e.currentRuns()
}

// An unusable claimed upgrade (another kind's request) is moved aside with a
// Failed status instead of failing every run; the next good request runs.
func TestUnusableClaimedRequestMovedAside(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cp, err := e.d.Requests.ClaimedPath(requests.Upgrade)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cp, []byte(`{"kind":"reset","id":"reset-3-op-z","operation":"op-z","machineGeneration":3}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if res, err := Run(t.Context(), e.d, e.job()); err != nil || res.Outcome != Nothing {
		t.Fatalf("run with an unusable claimed request: %+v, %v", res, err)
	}
	if st, err := e.d.Requests.ReadStatus("reset-3-op-z"); err != nil || st.Phase != requests.Failed {
		t.Fatalf("status of the refused request: %+v, %v", st, err)
	}
	p, sha := e.makeBundle("2.0", bundleOpts{})
	e.request(e.serve(p), sha)
	if res, err := Run(t.Context(), e.d, e.job()); err != nil || res.Outcome != Upgraded {
		t.Fatalf("the next request: %+v, %v", res, err)
	}
}

// countingRunner records every program run.
type countingRunner struct {
	inner Runner
	ran   []string
}

func (c *countingRunner) Output(ctx context.Context, p string, args ...string) ([]byte, error) {
	c.ran = append(c.ran, p)
	return c.inner.Output(ctx, p, args...)
}

// --preflight executes nothing, neither the bundle's binaries (untrusted
// without --sha256) nor the running release's: versions come from the
// manifests, or from the binaries' build information read as files.
func TestPreflightExecutesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rec := &countingRunner{inner: e.d.Exec}
	e.d.Exec = rec
	p, _ := e.makeBundle("2.0", bundleOpts{})
	plan, err := PreflightPlan(t.Context(), e.d, Job{Bundle: p})
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.ran) != 0 {
		t.Errorf("preflight ran %v", rec.ran)
	}
	if plan.ToVersion != "2.0" || plan.FromVersion == "" {
		t.Errorf("plan %+v", plan)
	}
}

// A pre-signed bundle URL with credentials reaches neither the log nor the
// preflight's plan.
func TestBundleURLRedacted(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p, sha := e.makeBundle("2.0", bundleOpts{})
	u := e.serve(p) + "?X-Amz-Signature=sekr1tsig"
	e.request(strings.Replace(u, "http://", "http://user:hunter2pw@", 1), sha)
	plan, err := PreflightPlan(t.Context(), e.d, Job{})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	plan.WriteText(&buf)
	plan.WriteJSON(&buf)
	os.Remove(func() string { p, _ := e.d.Requests.RequestPath(requests.Upgrade); return p }())
	e.request(u, sha)
	if _, err := Run(t.Context(), e.d, e.job()); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"hunter2pw", "sekr1tsig"} {
		if strings.Contains(e.log.String()+buf.String(), s) {
			t.Errorf("%q reached the log or the plan:\n%s\n%s", s, e.log, buf.String())
		}
	}
}

// A triggered run whose request was moved aside reports that, naming the
// file and why, not "no upgrade request to claim".
func TestRefusedRequestReportedAsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p, err := e.d.Requests.RequestPath(requests.Upgrade)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(`not json`), 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := Run(t.Context(), e.d, e.job())
	if err != nil || res.Outcome != Nothing {
		t.Fatalf("run with a refused request: %+v, %v", res, err)
	}
	if !strings.Contains(res.Message, "refused") || !strings.Contains(res.Message, "requests/upgrade.json") || !strings.Contains(res.Message, "state/rejected-upgrade-request-") {
		t.Errorf("message %q does not say the request was refused and where it went", res.Message)
	}
}
