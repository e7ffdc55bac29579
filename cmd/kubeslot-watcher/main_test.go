package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/cli/clitest"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

func TestCommandLine(t *testing.T) {
	clitest.CommonFlags(t, name, run)
	if code, _, _ := clitest.Call(run, "", "--lock-wait", "soon"); code != exitcode.Usage {
		t.Errorf("--lock-wait soon: exit %d, want %d", code, exitcode.Usage)
	}
}

// TestDeferral: without a complete installation the watcher exits 69 and
// logs no error.
func TestDeferral(t *testing.T) {
	prefix := t.TempDir()
	root, err := hostroot.New(prefix, "")
	if err != nil {
		t.Fatal(err)
	}
	call := func() (int, string) {
		code, _, errs := clitest.Call(run, "", "--root-prefix", prefix, "--lock-wait", "2s")
		return code, errs
	}
	check := func(what string) {
		t.Helper()
		code, errs := call()
		if code != exitcode.Deferred || strings.Contains(errs, "ERROR") || !strings.Contains(errs, "deferred") {
			t.Errorf("%s: exit %d, stderr %q; want %d, a deferral line and no error", what, code, errs, exitcode.Deferred)
		}
	}
	check("no installation")

	if err := root.EnsureLayout(); err != nil {
		t.Fatal(err)
	}
	rec, err := ownership.New("node1", strings.Repeat("ab", 32), "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := ownership.Save(root, rec); err != nil {
		t.Fatal(err)
	}
	check("installation at " + string(rec.Checkpoint))

	// The lock held by another stage past --lock-wait is waited out, round
	// after round, never a deferral: a deferred watcher is not restarted.
	l := lockFor(t, root)
	released := make(chan struct{})
	go func() {
		time.Sleep(2500 * time.Millisecond)
		l.Release()
		close(released)
	}()
	t0 := time.Now()
	code, _, errs := clitest.Call(run, "", "--root-prefix", prefix, "--lock-wait", "1s")
	<-released
	if took := time.Since(t0); code != exitcode.Deferred || took < 2*time.Second || strings.Count(errs, "installation lock still busy; waiting on") < 2 ||
		!strings.Contains(errs, "not complete") {
		t.Errorf("lock held 2.5s, --lock-wait 1s: exit %d after %s, stderr %q; want rounds of waiting, then the deferral for the incomplete installation", code, took, errs)
	}

	// Complete, but no identity: a failure naming the file.
	for _, cp := range ownership.InstallCheckpoints()[1:] {
		if err := rec.SetCheckpoint(cp); err != nil {
			t.Fatal(err)
		}
	}
	if err := ownership.Save(root, rec); err != nil {
		t.Fatal(err)
	}
	code, errs = call()
	if code != exitcode.Failure || !strings.Contains(errs, "identity/kubeconfig") {
		t.Errorf("complete without identity: exit %d, stderr %q; want %d naming the kubeconfig", code, errs, exitcode.Failure)
	}
}

// TestStoppedWhileWaitingForTheLock: a watcher stopped (SIGTERM) while it
// waits for the lock exits 69, not 1: a failure would start the recovery
// unit (OnFailure=) and roll an upgrade back (found on the rig: the
// upgrader restarts the watcher while it holds the lock).
func TestStoppedWhileWaitingForTheLock(t *testing.T) {
	prefix := t.TempDir()
	root, err := hostroot.New(prefix, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := root.EnsureLayout(); err != nil {
		t.Fatal(err)
	}
	lockFor(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond) // the SIGTERM
	defer cancel()
	f := flags{LockWait: time.Second}
	_, err = start(ctx, root, f, slog.New(slog.DiscardHandler))
	if exitcode.Of(err) != exitcode.Deferred {
		t.Errorf("stopped while waiting: %v (exit %d), want %d", err, exitcode.Of(err), exitcode.Deferred)
	}
}

// An empty root prefix or host root is refused, never taken for "/" (issue 17, item 3).
func TestEmptyRootRefused(t *testing.T) { clitest.EmptyRoot(t, name, run) }
