package ownership

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

// free reports whether another holder could take the lock now.
func free(t *testing.T, root *hostroot.Root) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	l, err := Acquire(ctx, root, Holder{Stage: "kubeslot-probe"}, nil)
	if err != nil {
		return false
	}
	l.Release()
	return true
}

func TestBeginBusyDefers(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	other, err := Acquire(context.Background(), root, Holder{Stage: "kubeslot-other"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release()
	for _, c := range []struct{ waitName, want string }{
		{"", "ms"},
		{"timeouts.lock", "ms (timeouts.lock 100ms)"},
	} {
		admitted := false
		h, err := Begin(context.Background(), root, Prologue{Stage: "kubeslot-test", Wait: 100 * time.Millisecond, WaitName: c.waitName,
			Admit: func(r *Record, err error) (*Record, error) { admitted = true; return r, err }})
		if h != nil || exitcode.Of(err) != exitcode.Deferred || !errors.Is(err, ErrLockTimeout) {
			t.Fatalf("busy lock: %v, %v (exit %d); want a deferral", h, err, exitcode.Of(err))
		}
		if !strings.Contains(err.Error(), "kubeslot-other") || !strings.HasSuffix(err.Error(), c.want) {
			t.Errorf("wait name %q: %q; want the holder named and the end %q", c.waitName, err, c.want)
		}
		if admitted {
			t.Error("admission ran without the lock")
		}
	}
}

func TestBeginHoldsAndNamesTheInstallation(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	rec := installed(t, root, CheckpointComplete)
	h, err := Begin(context.Background(), root, Prologue{Stage: "kubeslot-test"})
	if err != nil {
		t.Fatal(err)
	}
	if h.Record == nil || h.Record.InstallID != rec.InstallID {
		t.Fatalf("record %+v, want installation %s", h.Record, rec.InstallID)
	}
	if got := h.Lock.Holder(); got.Stage != "kubeslot-test" || got.InstallID != rec.InstallID {
		t.Errorf("holder %+v: want the stage and the installation", got)
	}
	if free(t, root) {
		t.Fatal("lock free while held")
	}
	h.Release()
	h.Release()
	if h.Lock != nil || !free(t, root) {
		t.Error("lock still held after Release")
	}
	// Taken back as it was taken, naming the installation again.
	if err := h.Retake(context.Background()); err != nil {
		t.Fatal(err)
	}
	if h.Lock == nil || h.Lock.Holder().InstallID != rec.InstallID || free(t, root) {
		t.Errorf("after Retake: lock %v; want it held and naming %s", h.Lock, rec.InstallID)
	}
	l := h.Lock
	if err := h.Retake(context.Background()); err != nil || h.Lock != l {
		t.Errorf("Retake of a held lock: %v; want it kept as it is", err)
	}
	h.Release()
}

func TestBeginAdmission(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	refused := errors.New("not this one")
	h, err := Begin(context.Background(), root, Prologue{Stage: "kubeslot-test",
		Admit: func(*Record, error) (*Record, error) { return nil, refused }})
	if h != nil || err != refused {
		t.Errorf("refused: %v, %v; want the admission's error as it is", h, err)
	}
	if !free(t, root) {
		t.Error("a refused stage kept the lock")
	}
	// Made by the admission: held and named like a loaded one.
	made := newRecord(t, "node-1", testFP)
	h, err = Begin(context.Background(), root, Prologue{Stage: "kubeslot-test",
		Admit: func(r *Record, err error) (*Record, error) { return made, err }})
	if err != nil || h.Record != made || h.Lock.Holder().InstallID != made.InstallID {
		t.Errorf("admission's record: %v; want it held and named", err)
	}
	h.Release()
	// No admission: Load's result, its error included.
	if err := os.WriteFile(recordPath(t, root), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Begin(context.Background(), root, Prologue{Stage: "kubeslot-test"}); !errors.Is(err, ErrDamagedRecord) {
		t.Errorf("damaged record: %v", err)
	}
	if !free(t, root) {
		t.Error("lock kept after a damaged record")
	}
}

func TestRequireComplete(t *testing.T) {
	t.Parallel()
	admit := RequireComplete("not complete: bootstrap first")
	for _, cp := range []Checkpoint{"", CheckpointStartingNode, CheckpointResetting} {
		var rec *Record
		if cp != "" {
			rec = newRecord(t, "node-1", testFP)
			rec.Checkpoint = cp
		}
		if _, err := admit(rec, nil); exitcode.Of(err) != exitcode.Deferred || err.Error() != "not complete: bootstrap first" {
			t.Errorf("checkpoint %q: %v; want the deferral", cp, err)
		}
	}
	rec := newRecord(t, "node-1", testFP)
	rec.Checkpoint = CheckpointComplete
	if got, err := admit(rec, nil); got != rec || err != nil {
		t.Errorf("complete: %v, %v", got, err)
	}
	damaged := &DamagedError{Path: "x", Problem: "torn"}
	if _, err := admit(nil, damaged); err != damaged {
		t.Errorf("damaged: %v; want Load's error as it is", err)
	}
}
