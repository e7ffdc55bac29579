package reset

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/units"
)

func TestStepOrder(t *testing.T) {
	want := []string{"mark-resetting", "install-resetting-unit", "report-request", "stop-watcher", "stop-units", "stop-machines", "remove-nspawn",
		"remove-rootfs", "undo-journal", "remove-join-token", "remove-bootstrap-unit", "remove-units", "remove-host-root", "remove-record"}
	if got := StepNames(); !slices.Equal(got, want) {
		t.Errorf("steps:\n got %v\nwant %v", got, want)
	}
	// Request path: report after every step that can fail on the host's account, then stop
	// the watcher, last of all the units, before the files go.
	want = []string{"mark-resetting", "install-resetting-unit", "stop-units", "stop-machines", "remove-nspawn", "remove-rootfs", "undo-journal",
		"remove-join-token", "remove-bootstrap-unit", "report-request", "stop-watcher", "remove-units", "remove-host-root", "remove-record"}
	var got []string
	for _, s := range StepsFor(true) {
		got = append(got, s.Name)
	}
	if !slices.Equal(got, want) {
		t.Errorf("request-path steps:\n got %v\nwant %v", got, want)
	}
}

// TestJournalGroups: each journal entry is undone by exactly the step that owns it, directories with the step that
// empties them.
func TestJournalGroups(t *testing.T) {
	h := newHost(t)
	want := map[string]string{
		"/etc/modules-load.d/kubeslot.conf":                                    StepUndoJournal,
		"/var/lib/machines/a":                                                  StepRemoveRootfs,
		"/etc/systemd/nspawn/a.nspawn":                                         StepRemoveNspawn,
		"/etc/systemd/system/systemd-nspawn@a.service.d":                       StepRemoveNspawn,
		"/etc/systemd/system/systemd-nspawn@a.service.d/kubeslot.conf":         StepRemoveNspawn,
		"/etc/systemd/system/machines.target.wants":                            StepRemoveNspawn,
		"/etc/systemd/system/multi-user.target.wants/machines.target":          StepRemoveNspawn,
		"/etc/systemd/system/multi-user.target.wants/kubeslot-reset.path":      StepStopUnits,
		"/etc/systemd/system/kubeslot-reset.path":                              StepRemoveUnits,
		"/etc/systemd/system/multi-user.target.wants/kubeslot-watcher.service": StepRemoveUnits,
		"/etc/systemd/system/custom.service":                                   StepUndoJournal,
	}
	for _, c := range h.rec.Journal {
		if w, ok := want[c.Path]; ok {
			if g := groupOf(c, h.rec.Journal); g != w {
				t.Errorf("%s %s: undone in %s, want %s", c.Kind, c.Path, g, w)
			}
			delete(want, c.Path)
		}
	}
	for p := range want {
		t.Errorf("%s: not in the journal", p)
	}
	// A layered slot's mount unit goes with the slots' settings, after stop-machines unmounted it.
	if g := ownGroup(ownership.Change{Kind: ownership.KindUnit, Path: "/etc/systemd/system/var-lib-machines-a.mount"}); g != StepRemoveNspawn {
		t.Errorf("slot mount unit: undone in %s, want %s", g, StepRemoveNspawn)
	}
}

func checkReset(t *testing.T, h *host) {
	t.Helper()
	for _, p := range kubeslotPaths {
		if h.exists(p) {
			t.Errorf("%s still there after the reset", p)
		}
	}
	for p, c := range foreignFiles {
		if got := h.read(p); got != c {
			t.Errorf("foreign %s: %q, want %q", p, got, c)
		}
	}
	if got := h.read("/etc/modules-load.d/kubeslot.conf"); got != "# the admin's own\nloop\n" {
		t.Errorf("module file kubeslot replaced not restored: %q", got)
	}
	if got := h.read("/etc/systemd/system/custom.service"); got != "[Service]\nExecStart=/bin/false\n" {
		t.Errorf("unit kubeslot replaced not restored: %q", got)
	}
	if !h.exists("/etc/systemd/system/multi-user.target.wants") {
		t.Errorf("multi-user.target.wants, there before kubeslot, was removed")
	}
	if h.exists("/etc/systemd/system/machines.target.wants") {
		t.Errorf("machines.target.wants, made by kubeslot, is still there")
	}
	if rec, err := ownership.Load(h.root); err != nil || rec != nil {
		t.Errorf("ownership record after the reset: %+v %v", rec, err)
	}
	checkConfigKept(t, h)
}

// checkConfigKept: the operator's configuration is there, 0600, without the
// join token, and every other line as it was; the token's line is a comment.
func checkConfigKept(t *testing.T, h *host) {
	t.Helper()
	got := h.read(units.ConfigPath)
	if strings.Contains(got, operatorToken) || strings.Contains(got, "0123456789abcdef") {
		t.Errorf("%s still holds the join token:\n%s", units.ConfigPath, got)
	}
	gotLines, wantLines := strings.Split(got, "\n"), strings.Split(operatorConfig, "\n")
	if len(gotLines) != len(wantLines) {
		t.Fatalf("%s: %d lines, want %d:\n%s", units.ConfigPath, len(gotLines), len(wantLines), got)
	}
	for i, w := range wantLines {
		g := gotLines[i]
		if strings.HasPrefix(w, "bootstrap_token") {
			if !strings.HasPrefix(g, "# bootstrap_token removed by kubeslot-resetter") || !strings.HasSuffix(g, "   # rotated weekly") {
				t.Errorf("%s line %d: %q, want the removal note and the operator's trailing comment", units.ConfigPath, i+1, g)
			}
			continue
		}
		if g != w {
			t.Errorf("%s line %d: %q, want %q (kept as it was)", units.ConfigPath, i+1, g, w)
		}
	}
	if fi, err := os.Stat(h.local(units.ConfigPath)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s mode after the reset: %v %v, want 0600", units.ConfigPath, fi, err)
	}
}

func TestResetRemovesOnlyWhatItMade(t *testing.T) {
	h := newHost(t)
	res, err := Run(t.Context(), h.deps())
	if err != nil {
		t.Fatal(err)
	}
	if res.Nothing || res.Resumed || len(res.Steps) != len(Steps()) {
		t.Errorf("result %+v", res)
	}
	checkReset(t, h)
	if !slices.Equal(h.sys.podNetworks, []string{"cni0"}) {
		t.Errorf("pod networks removed: %v, want [cni0] (journalled by the bridge mode)", h.sys.podNetworks)
	}
	if !slices.Equal(h.sys.removed, []string{"systemd-container"}) {
		t.Errorf("packages removed: %v, want the one kubeslot installed", h.sys.removed)
	}
	calls := h.sd.Calls()
	idx := func(s string) int {
		i := slices.Index(calls, s)
		if i < 0 {
			t.Errorf("no %q in %v", s, calls)
		}
		return i
	}
	w, p, m, b := idx("stop "+units.Watcher), idx("stop kubeslot-reset.path"), idx("stop systemd-nspawn@a.service"), idx("stop "+units.Bootstrap)
	if !(w < p && p < m && m < b) {
		t.Errorf("stop order: watcher %d, path unit %d, machine %d, bootstrap %d: %v", w, p, m, b, calls)
	}
	// A layered slot's rootfs is unmounted after its machine, before its directories go.
	if mnt := idx("stop var-lib-machines-a.mount"); !(m < mnt && mnt < b) {
		t.Errorf("stop order: machine %d, rootfs mount %d, bootstrap %d: %v", m, mnt, b, calls)
	}
	if !slices.Contains(calls, "reload") {
		t.Errorf("systemd never reloaded: %v", calls)
	}
	// A second run finds nothing.
	res, err = Run(t.Context(), h.deps())
	if err != nil || !res.Nothing {
		t.Errorf("second run: %+v %v, want nothing to reset", res, err)
	}
}

// TestEachStepIdempotent runs every step twice: the second run succeeds and changes nothing.
func TestEachStepIdempotent(t *testing.T) {
	h := newHost(t)
	r := &runner{d: h.deps(), rec: h.rec, log: discard()}
	r.d.Log = discard()
	for _, s := range Steps() {
		if err := s.run(r, t.Context()); err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		after := h.tree()
		if err := s.run(r, t.Context()); err != nil {
			t.Errorf("%s again: %v", s.Name, err)
		}
		if again := h.tree(); again != after {
			t.Errorf("%s again changed the host:\n%s\n---\n%s", s.Name, after, again)
		}
	}
	checkReset(t, h)
}

// TestResumeAfterFailureAtEachStep: a failure before each step (and one inside a step) stops the run with the record
// resetting; a re-run finishes, with the same result as an uninterrupted reset.
func TestResumeAfterFailureAtEachStep(t *testing.T) {
	ref := newHost(t)
	if _, err := Run(t.Context(), ref.deps()); err != nil {
		t.Fatal(err)
	}
	want := strip(ref.tree(), ref.root.Prefix())
	for i, step := range StepNames() {
		t.Run(step, func(t *testing.T) {
			t.Parallel() // a host of its own; the steps' synced writes overlap
			h := newHost(t)
			d := h.deps()
			injected := errors.New("injected")
			d.Before = func(ctx context.Context, s string) error {
				if s == step {
					return injected
				}
				return nil
			}
			_, err := Run(t.Context(), d)
			var se *StepError
			if !errors.As(err, &se) || se.Step != step || !errors.Is(err, injected) || exitcode.Of(err) != exitcode.Failure {
				t.Fatalf("run with a failure at %s: %v", step, err)
			}
			if !strings.Contains(err.Error(), "run kubeslot-resetter again") {
				t.Errorf("error does not say what to do: %v", err)
			}
			rec, lerr := ownership.Load(h.root)
			if lerr != nil || rec == nil {
				t.Fatalf("record after a failure at %s: %v %v", step, rec, lerr)
			}
			if i > 0 && rec.Checkpoint != ownership.CheckpointResetting {
				t.Errorf("checkpoint after a failure at %s: %s, want resetting", step, rec.Checkpoint)
			}
			res, err := Run(t.Context(), h.deps())
			if err != nil {
				t.Fatalf("re-run after a failure at %s: %v", step, err)
			}
			if i > 0 && !res.Resumed {
				t.Errorf("re-run did not resume")
			}
			checkReset(t, h)
			if got := strip(h.tree(), h.root.Prefix()); got != want {
				t.Errorf("after a failure at %s and a re-run the host differs from an uninterrupted reset:\n%s\n---\n%s", step, got, want)
			}
		})
	}
	t.Run("inside stop-machines", func(t *testing.T) {
		h := newHost(t)
		h.sd.Fail["stop systemd-nspawn@a.service"] = errors.New("job failed")
		h.sd.Fail["terminate a"] = errors.New("no permission")
		_, err := Run(t.Context(), h.deps())
		if err == nil || !strings.Contains(err.Error(), "stop-machines") || !strings.Contains(err.Error(), "no permission") {
			t.Fatalf("machine that cannot be stopped: %v", err)
		}
		if !h.exists("/var/lib/machines/a") {
			t.Errorf("rootfs removed although its machine did not stop")
		}
		if rec, _ := ownership.Load(h.root); rec == nil || rec.Checkpoint != ownership.CheckpointResetting {
			t.Errorf("record: %+v", rec)
		}
		h.sd.Fail = map[string]error{}
		if _, err := Run(t.Context(), h.deps()); err != nil {
			t.Fatal(err)
		}
		checkReset(t, h)
	})
}

func strip(tree, prefix string) string { return strings.ReplaceAll(tree, prefix, "") }

func TestDryRunChangesNothing(t *testing.T) {
	h := newHost(t)
	before := h.tree()
	var out bytes.Buffer
	found, err := DryRun(h.root, &out)
	if err != nil || !found {
		t.Fatalf("dry run: %v %v", found, err)
	}
	if after := h.tree(); after != before {
		t.Errorf("dry run changed the host:\n%s\n---\n%s", before, after)
	}
	s := out.String()
	for _, want := range []string{"/etc/systemd/nspawn/a.nspawn", "remove /etc/systemd/system/kubeslot-bootstrap.service",
		"stop systemd-nspawn@a.service", "stop var-lib-machines-a.mount", "package systemd-container: apt-get remove", "custom.service: restore the prior file",
		"/opt/kubeslot/releases", "nothing was changed"} {
		if !strings.Contains(s, want) {
			t.Errorf("dry run does not mention %q:\n%s", want, s)
		}
	}
	for _, foreign := range []string{"foreign", "operator.conf", "/var/lib/machines/other", "99-"} {
		if strings.Contains(s, foreign) {
			t.Errorf("dry run lists the foreign %q:\n%s", foreign, s)
		}
	}
	if len(h.sd.Calls()) != 0 {
		t.Errorf("dry run called systemd: %v", h.sd.Calls())
	}
}

func TestNothingToReset(t *testing.T) {
	h := newHost(t)
	if err := ownership.Remove(h.root); err != nil {
		t.Fatal(err)
	}
	before := h.tree()
	res, err := Run(t.Context(), h.deps())
	if err != nil || !res.Nothing {
		t.Fatalf("no record: %+v %v", res, err)
	}
	if after := h.tree(); after != before {
		t.Errorf("a run without a record changed the host:\n%s\n---\n%s", before, after)
	}
	var out bytes.Buffer
	if found, err := DryRun(h.root, &out); err != nil || found || !strings.Contains(out.String(), "nothing to reset") {
		t.Errorf("dry run without a record: %v %v %s", found, err, out.String())
	}
}

func TestLockBusyDefers(t *testing.T) {
	h := newHost(t)
	l, err := ownership.Acquire(t.Context(), h.root, ownership.Holder{Stage: "kubeslot-test"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	d := h.deps()
	d.LockWait = 200 * time.Millisecond
	before := h.tree()
	_, err = Run(t.Context(), d)
	if exitcode.Of(err) != exitcode.Deferred || !strings.Contains(err.Error(), "kubeslot-test") {
		t.Errorf("busy lock: %v (exit %d), want 69 naming the holder", err, exitcode.Of(err))
	}
	if after := h.tree(); after != before {
		t.Errorf("a deferred run changed the host")
	}
}

// TestRequestPath: kubeslot-reset.service hands the request over to the resetting unit, whose run claims it and
// reports it Succeeded before the watcher stops; the watcher's publication is waited for; the resetting unit
// never stops itself.
func TestRequestPath(t *testing.T) {
	h := newHost(t)
	h.sd.Units["kubeslot-reset.service"] = "activating"
	dir := requests.New(h.root)
	req := &requests.Request{Kind: requests.Reset, ID: requests.NewID(requests.Reset, 4, "wipe"), Operation: "wipe", MachineGeneration: 4, Reason: "test"}
	if _, err := dir.Write(req); err != nil {
		t.Fatal(err)
	}
	// The watcher: publishes the status once it appears.
	published := make(chan time.Time, 1)
	watcherLock := make(chan error, 1)
	go func() {
		for range 200 {
			if st, err := dir.ReadStatus(req.ID); err == nil && st.Phase == requests.Succeeded {
				// A watcher that starts up now needs the lock first: the resetter lets it go while it waits.
				lctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				l, lerr := ownership.Acquire(lctx, h.root, ownership.Holder{Stage: "kubeslot-watcher"}, nil)
				cancel()
				if lerr == nil {
					lerr = l.Release()
				}
				watcherLock <- lerr
				p, _ := dir.LoadPublished()
				p[req.ID] = st.Phase
				at := time.Now() // before the resetter can see it
				_ = dir.SavePublished(p)
				published <- at
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	// kubeslot-reset.service hands over: the host is marked resetting, the
	// resetting unit installed and started; nothing else changes yet.
	d := h.deps()
	d.Request = true
	res, err := Run(t.Context(), d)
	if err != nil || !res.HandedOver || res.RequestID != req.ID {
		t.Fatalf("hand-over: %+v %v", res, err)
	}
	if !slices.Contains(h.sd.Calls(), "start "+units.Resetting) {
		t.Errorf("the resetting unit was not started: %v", h.sd.Calls())
	}
	if rec, _ := ownership.Load(h.root); rec == nil || rec.Checkpoint != ownership.CheckpointResetting {
		t.Errorf("record after the hand-over: %+v", rec)
	}
	if !strings.Contains(h.read("/etc/systemd/system/"+units.Resetting), "KUBESLOT_REQUEST=reset\n") ||
		h.read("/opt/kubeslot/resetting/kubeslot-resetter") != h.readLocal(h.self) ||
		!h.exists("/etc/systemd/system/multi-user.target.wants/"+units.Resetting) {
		t.Errorf("the resetting unit is not installed for a request: %s", h.read("/etc/systemd/system/"+units.Resetting))
	}
	if c, _ := dir.Pending(requests.Reset); c == nil {
		t.Errorf("the hand-over claimed the request: the resetting unit claims it")
	}
	if !h.exists("/var/lib/machines/a") || !h.exists("/etc/systemd/system/"+units.Watcher) {
		t.Errorf("the hand-over did more than hand over")
	}
	// Started again by the path unit while the resetting unit runs: defers.
	h.sd.Units[units.Resetting] = "active"
	if _, err := Run(t.Context(), d); exitcode.Of(err) != exitcode.Deferred {
		t.Errorf("a second hand-over while the resetting unit runs: %v, want deferred", err)
	}
	h.sd.Units[units.Resetting] = "activating"

	// The resetting unit's run does the work.
	d.Resume = true
	var watcherStopped time.Time
	d.Before = func(ctx context.Context, s string) error {
		if s == StepStopWatcher {
			watcherStopped = time.Now()
			st, err := dir.ReadStatus(req.ID)
			if err != nil || st.Phase != requests.Succeeded || st.Operation != "wipe" {
				return fmt.Errorf("status before the watcher stops: %+v %v", st, err)
			}
			// Last: every other unit and the node are stopped, the first-boot unit is gone, the watcher's own
			// unit file and the host root are still there.
			calls := h.sd.Calls()
			for _, u := range []string{units.PathUnit("reset"), "systemd-nspawn@a.service", units.Bootstrap} {
				if !slices.Contains(calls, "stop "+u) {
					return fmt.Errorf("%s not stopped before the watcher: %v", u, calls)
				}
			}
			if slices.Contains(calls, "stop "+units.Watcher) {
				return fmt.Errorf("the watcher was stopped before its step: %v", calls)
			}
			for _, p := range []string{"/etc/systemd/system/" + units.Bootstrap, "/var/lib/machines/a"} {
				if h.exists(p) {
					return fmt.Errorf("%s still there when the watcher is stopped", p)
				}
			}
			for _, p := range []string{"/etc/systemd/system/" + units.Watcher, "/opt/kubeslot/applied/a.json"} {
				if !h.exists(p) {
					return fmt.Errorf("%s gone before the watcher is stopped", p)
				}
			}
		}
		return nil
	}
	res, err = Run(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	if res.RequestID != req.ID {
		t.Errorf("request served: %q", res.RequestID)
	}
	select {
	case err := <-watcherLock:
		if err != nil {
			t.Errorf("the watcher could not take the lock while the resetter waited for it: %v", err)
		}
	default:
		t.Errorf("the fake watcher never tried the lock")
	}
	select {
	case at := <-published:
		if at.After(watcherStopped) {
			t.Errorf("the watcher was stopped before it published the result")
		}
	default:
		t.Errorf("the result was never published")
	}
	if slices.Contains(h.sd.Calls(), "stop "+units.Resetting) {
		t.Errorf("the resetting unit stopped itself: %v", h.sd.Calls())
	}
	if !slices.Contains(h.sd.Calls(), "stop kubeslot-reset.service") {
		t.Errorf("kubeslot-reset.service (started again by its path unit) was not stopped: %v", h.sd.Calls())
	}
	if !slices.Contains(h.sd.Calls(), "stop "+units.Watcher) {
		t.Errorf("the watcher was never stopped: %v", h.sd.Calls())
	}
	checkReset(t, h)

	// No request: nothing is done.
	h2 := newHost(t)
	d2 := h2.deps()
	d2.Request = true
	before := h2.tree()
	res, err = Run(t.Context(), d2)
	if err != nil || !res.Nothing {
		t.Errorf("request path without a request: %+v %v", res, err)
	}
	if after := h2.tree(); strip(after, h2.root.Prefix()) != strip(before, h2.root.Prefix()) {
		// Claim creates requests/ and state/, which exist already.
		t.Errorf("request path without a request changed the host")
	}
}

func TestRefusesSystemDirAsBase(t *testing.T) {
	h := newHost(t)
	r := &runner{d: h.deps()}
	for _, b := range []string{"/opt", "/var/lib", "/usr"} {
		root, err := hostRootWithBase(h, b)
		if err != nil {
			t.Fatal(err)
		}
		r.d.Root = root
		if _, err := r.base(); err == nil {
			t.Errorf("base %s accepted for removal", b)
		}
	}
}

// TestRequestPathResumesWithoutRequest: a request-mode run that fails (or is killed) before any step is re-run
// by systemd in request mode (Restart=on-failure); once the request is finished, the re-run finds none but the
// record is resetting, so it finishes the reset instead of doing nothing, and a killed wait for the watcher's
// publication is waited for again. The result is the same as an uninterrupted reset.
func TestRequestPathResumesWithoutRequest(t *testing.T) {
	ref := newHost(t)
	if _, err := Run(t.Context(), ref.deps()); err != nil {
		t.Fatal(err)
	}
	want := strip(ref.tree(), ref.root.Prefix())
	var order []string // the request path's order
	for _, s := range StepsFor(true) {
		order = append(order, s.Name)
	}
	for i, step := range order {
		t.Run(step, func(t *testing.T) {
			t.Parallel() // a host of its own; the steps' synced writes overlap
			h := newHost(t)
			dir := requests.New(h.root)
			req := &requests.Request{Kind: requests.Reset, ID: requests.NewID(requests.Reset, 2, "op"), Operation: "op", MachineGeneration: 2, Reason: "test"}
			if _, err := dir.Write(req); err != nil {
				t.Fatal(err)
			}
			handOver(t, h)
			d := h.deps()
			d.Request, d.Resume = true, true // the resetting unit's runs
			// No watcher publishes in either run: give up at the first look, not
			// after a 200 ms poll.
			d.PublishWait = time.Nanosecond
			injected := errors.New("killed")
			d.Before = func(ctx context.Context, s string) error {
				if s == step {
					return injected
				}
				return nil
			}
			if _, err := Run(t.Context(), d); !errors.Is(err, injected) {
				t.Fatalf("first run: %v", err)
			}
			// The watcher (still running in request mode until its step) publishes what is there.
			published := false
			if st, err := dir.ReadStatus(req.ID); err == nil && st.Phase == requests.Succeeded {
				p, _ := dir.LoadPublished()
				p[req.ID] = st.Phase
				if err := dir.SavePublished(p); err != nil {
					t.Fatal(err)
				}
				published = true
			}
			d2 := h.deps()
			d2.Request, d2.Resume = true, true
			d2.PublishWait = time.Nanosecond
			res, err := Run(t.Context(), d2)
			if err != nil {
				t.Fatalf("re-run in request mode after a failure at %s: %v", step, err)
			}
			if res.Nothing {
				t.Fatalf("re-run in request mode after a failure at %s did nothing", step)
			}
			if i > slices.Index(order, StepReportRequest) && i <= slices.Index(order, StepRemoveHostRoot) && !published {
				t.Errorf("no Succeeded status after the report step")
			}
			checkReset(t, h)
			if got := strip(h.tree(), h.root.Prefix()); got != want {
				t.Errorf("after a failure at %s and a request-mode re-run the host differs from an uninterrupted reset:\n%s\n---\n%s", step, got, want)
			}
		})
	}
}

// handOver is kubeslot-reset.service's run: it hands the pending request over to the resetting unit.
func handOver(t *testing.T, h *host) {
	t.Helper()
	d := h.deps()
	d.Request = true
	if res, err := Run(t.Context(), d); err != nil || !res.HandedOver {
		t.Fatalf("hand-over: %+v %v", res, err)
	}
}

// TestStopsEveryWorkerInstance: every loaded instance of a worker template is stopped (not only repave@next),
// found by pattern; units that are not kubeslot's are left alone.
func TestStopsEveryWorkerInstance(t *testing.T) {
	h := newHost(t)
	for _, u := range []string{"kubeslot-repave@a.service", "kubeslot-repave@b.service", "kubeslot-repave@next.service", "kubeslot-upgrade.service", "other-repave@a.service"} {
		h.sd.Units[u] = "activating"
	}
	if _, err := Run(t.Context(), h.deps()); err != nil {
		t.Fatal(err)
	}
	calls := h.sd.Calls()
	if !slices.Contains(calls, "list [kubeslot-repave@*.service]") {
		t.Errorf("the loaded units were not listed by pattern: %v", calls)
	}
	for _, u := range []string{"kubeslot-repave@a.service", "kubeslot-repave@b.service", "kubeslot-repave@next.service", "kubeslot-upgrade.service"} {
		if !slices.Contains(calls, "stop "+u) {
			t.Errorf("%s not stopped: %v", u, calls)
		}
	}
	if slices.Contains(calls, "stop other-repave@a.service") {
		t.Errorf("a foreign unit was stopped")
	}
	checkReset(t, h)
}

// TestRequestPathReportsAfterTheWork: the AgentReset
// request is reported Succeeded only after every step that can fail on the
// host's account, and a step that fails before that reports Failed, naming
// the step, with the claim finished.
func TestRequestPathReportsAfterTheWork(t *testing.T) {
	order := map[string]int{}
	for i, s := range StepsFor(true) {
		order[s.Name] = i
	}
	for _, before := range []string{StepStopMachines, StepRemoveRootfs, StepUndoJournal, StepRemoveBootstrapUnit} {
		if order[before] > order[StepReportRequest] {
			t.Errorf("request path: %s runs after the report", before)
		}
	}
	if order[StepReportRequest] > order[StepStopWatcher] || order[StepStopWatcher] > order[StepRemoveUnits] {
		t.Errorf("request path order: %v", StepNames())
	}

	h := newHost(t)
	dir := requests.New(h.root)
	req := &requests.Request{Kind: requests.Reset, ID: requests.NewID(requests.Reset, 3, "op"), Operation: "op", MachineGeneration: 3, Reason: "test"}
	if _, err := dir.Write(req); err != nil {
		t.Fatal(err)
	}
	// The journal's undo fails: the pod network cannot be removed.
	handOver(t, h)
	d := h.deps()
	d.Request, d.Resume = true, true
	d.PublishWait = time.Nanosecond
	d.Sys.(*fakeSys).failPodNetwork = errors.New("iptables: resource busy")
	_, err := Run(t.Context(), d)
	var se *StepError
	if !errors.As(err, &se) || se.Step != StepUndoJournal {
		t.Fatalf("run: %v, want a failure in %s", err, StepUndoJournal)
	}
	st, rerr := dir.ReadStatus(req.ID)
	if rerr != nil || st.Phase != requests.Failed || !strings.Contains(st.Message, StepUndoJournal) || !strings.Contains(st.Message, "resource busy") {
		t.Errorf("status after the failure: %+v %v, want Failed naming the step and the cause", st, rerr)
	}
	if c, _ := dir.Claimed(requests.Reset); c != nil {
		t.Error("the failed request is still claimed: it would be retried unattended")
	}
}

// A damaged ownership record is refused, naming --force; with Force the
// reset works from what the record still says and removes the installation.
func TestForcedResetOfDamagedRecord(t *testing.T) {
	t.Run("salvaged journal", func(t *testing.T) {
		h := newHost(t)
		p, _ := ownership.RecordPath(h.root)
		b, _ := os.ReadFile(p)
		// An unknown checkpoint: strict decoding refuses the record.
		damaged := strings.Replace(string(b), `"checkpoint": "complete"`, `"checkpoint": "bogus"`, 1)
		if damaged == string(b) {
			t.Fatalf("record has no complete checkpoint:\n%s", b)
		}
		os.WriteFile(p, []byte(damaged), 0o600)
		if _, err := Run(t.Context(), h.deps()); err == nil || !strings.Contains(err.Error(), "--force") {
			t.Fatalf("damaged record without force: %v", err)
		}
		var plan bytes.Buffer
		if found, err := Plan(h.root, &plan, true); err != nil || !found || !strings.Contains(plan.String(), "damaged") {
			t.Fatalf("forced plan: %v %v\n%s", found, err, plan.String())
		}
		d := h.deps()
		d.Force = true
		if _, err := Run(t.Context(), d); err != nil {
			t.Fatal(err)
		}
		checkReset(t, h)
	})
	t.Run("record not JSON", func(t *testing.T) {
		h := newHost(t)
		p, _ := ownership.RecordPath(h.root)
		os.WriteFile(p, []byte(`{"schemaVersion": 1, "jour`), 0o600)
		var plan bytes.Buffer
		if _, err := Plan(h.root, &plan, true); err != nil || !strings.Contains(plan.String(), "lost, not undone: the whole journal") {
			t.Fatalf("forced plan: %v\n%s", err, plan.String())
		}
		d := h.deps()
		d.Force = true
		if _, err := Run(t.Context(), d); err != nil {
			t.Fatal(err)
		}
		if h.exists("/opt/kubeslot") {
			t.Error("the host root is still there")
		}
		// The journal is lost, but applied/a.json names the slot: its node is stopped, its files stay.
		if !slices.Contains(h.sd.Calls(), "stop systemd-nspawn@a.service") || machineRunning(h, "a") {
			t.Errorf("the node of slot a (named by applied/a.json) was not stopped: %v", h.sd.Calls())
		}
		for p := range foreignFiles {
			if !h.exists(p) {
				t.Errorf("%s (not kubeslot's) was removed", p)
			}
		}
	})
}

// TestResetLeavesTheOverlayOverAForeignMount: a mount inside a layered
// slot's rootfs (a person's, a leftover tmpfs) keeps the slot's overlay
// mounted — stopping its unit would have systemd unmount that mount too,
// and a tmpfs's data with it — and remove-rootfs refuses, naming it. Needs
// root for the mount.
func TestResetLeavesTheOverlayOverAForeignMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs")
	}
	h := newHost(t)
	busy := filepath.Join(h.root.Prefix(), "var/lib/machines/a/busy")
	if err := os.MkdirAll(busy, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("rig-busy", busy, "tmpfs", 0, ""); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(busy, syscall.MNT_DETACH) })
	_, err := Run(t.Context(), h.deps())
	if err == nil || !strings.Contains(err.Error(), string(StepRemoveRootfs)) || !strings.Contains(err.Error(), busy) {
		t.Fatalf("reset: %v, want a refusal in %s naming %s", err, StepRemoveRootfs, busy)
	}
	calls := h.sd.Calls()
	if !slices.Contains(calls, "stop systemd-nspawn@a.service") || slices.Contains(calls, "stop var-lib-machines-a.mount") {
		t.Errorf("systemd calls %v: want the machine stopped and its rootfs mount left", calls)
	}
	if _, err := os.Stat(busy); err != nil {
		t.Errorf("the foreign mount point went: %v", err)
	}
}
