package state

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

func newStore(t *testing.T) (*Store, *hostroot.Root, *config.Config) {
	t.Helper()
	root := testkit.LaidOut(t)
	cfg, err := config.Parse("example.toml", config.Example())
	if err != nil {
		t.Fatal(err)
	}
	return NewStore(root), root, cfg
}

func TestAppliedRoundTripAndActive(t *testing.T) {
	s, root, cfg := newStore(t)
	if a, err := s.ActiveApplied(); a != nil || err != nil {
		t.Fatalf("fresh host: %v %v", a, err)
	}
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	want := &Applied{Slot: "b", Mode: "nspawn", Fingerprint: cfg.Fingerprint(), AgentVersion: "v1", AppliedAt: at, Config: cfg}
	if err := s.SaveApplied(want); err != nil {
		t.Fatal(err)
	}
	if err := s.SetActive("b"); err != nil {
		t.Fatal(err)
	}
	got, err := s.ActiveApplied()
	if err != nil {
		t.Fatal(err)
	}
	if got.Slot != "b" || got.Fingerprint != want.Fingerprint || !got.AppliedAt.Equal(at) || got.Config.Fingerprint() != cfg.Fingerprint() {
		t.Errorf("round trip: %+v", got)
	}
	// The file holds the join secret: 0600.
	p, _ := root.Path(hostroot.AppliedDir, "b.json")
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode: %v %v", fi.Mode(), err)
	}
	if got.Config.Cluster.BootstrapToken.Reveal() != cfg.Cluster.BootstrapToken.Reveal() {
		t.Error("the join secret did not survive the round trip")
	}
}

func TestSetActiveRefusesSlotWithoutApplied(t *testing.T) {
	s, _, _ := newStore(t)
	if err := s.SetActive("a"); err == nil || !strings.Contains(err.Error(), `refusing to activate slot "a"`) {
		t.Fatalf("got %v", err)
	}
	if _, found, _ := s.Active(); found {
		t.Fatal("active pointer written for an unapplied slot")
	}
}

func TestLoadAppliedDamage(t *testing.T) {
	s, root, cfg := newStore(t)
	if err := s.SaveApplied(&Applied{Slot: "a", Mode: "nspawn", Config: cfg}); err != nil {
		t.Fatal(err)
	}
	p, _ := root.Path(hostroot.AppliedDir, "a.json")
	if err := os.Truncate(p, 20); err != nil {
		t.Fatal(err)
	}
	_, err := s.LoadApplied("a")
	var ce *hostroot.CorruptError
	if !errors.As(err, &ce) || ce.Path != p {
		t.Fatalf("truncated applied config: %v", err)
	}
	if _, err := s.LoadApplied("b"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("absent slot: %v", err)
	}
	for _, bad := range []string{"", "active", "../x", "a.b"} {
		if _, err := s.LoadApplied(bad); err == nil {
			t.Errorf("slot %q accepted", bad)
		}
	}
}

func TestActivePointingAtRemovedSlot(t *testing.T) {
	s, _, cfg := newStore(t)
	if err := s.SaveApplied(&Applied{Slot: "a", Mode: "nspawn", Config: cfg}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetActive("a"); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveApplied("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ActiveApplied(); err == nil || !strings.Contains(err.Error(), "active slot a has no applied configuration") {
		t.Fatalf("got %v", err)
	}
}

// TestActiveAppliedDuringACommit: a reader that read
// active just before a commit moved it and removed the old slot's
// configuration reads the new pair, not a false "no applied
// configuration"; a pair that stays broken is still reported.
func TestActiveAppliedDuringACommit(t *testing.T) {
	s, _, cfg := newStore(t)
	at := time.Now().UTC()
	for _, slot := range []string{"a", "b"} {
		if err := s.SaveApplied(&Applied{Slot: slot, Mode: "nspawn", Fingerprint: cfg.Fingerprint(), AgentVersion: "v1", AppliedAt: at, Config: cfg}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SetActive("a"); err != nil {
		t.Fatal(err)
	}
	committed := false
	s.betweenReads = func() {
		if committed {
			return
		}
		committed = true
		if err := s.SetActive("b"); err != nil { // the repaver's commit and clean, between the reader's two reads
			t.Fatal(err)
		}
		if err := s.RemoveApplied("a"); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.ActiveApplied()
	if err != nil || got.Slot != "b" {
		t.Fatalf("read across a commit: %+v %v, want slot b", got, err)
	}
	s.betweenReads = nil
	if err := s.RemoveApplied("b"); err != nil {
		t.Fatal(err)
	}
	var ce *hostroot.CorruptError
	if _, err := s.ActiveApplied(); !errors.As(err, &ce) {
		t.Errorf("active naming a slot without configuration: %v, want CorruptError", err)
	}
}

// State files are read with no-follow semantics, regular files only and
// bounded: a link out of the root, a FIFO and a
// 3 GB file are each refused at once as not trusted.
func TestStateFilesHostile(t *testing.T) {
	s, root, cfg := newStore(t)
	if err := s.SaveApplied(&Applied{Slot: "a", Mode: "nspawn", Config: cfg}); err != nil {
		t.Fatal(err)
	}
	p, _ := root.Path(hostroot.AppliedDir, "a.json")
	good, _ := os.ReadFile(p)
	outside := filepath.Join(t.TempDir(), "a.json")
	if err := os.WriteFile(outside, good, 0o600); err != nil {
		t.Fatal(err)
	}
	check := func(what string) {
		t.Helper()
		done := make(chan error, 1)
		go func() { _, err := s.LoadApplied("a"); done <- err }()
		select {
		case err := <-done:
			var ce *hostroot.CorruptError
			if !errors.As(err, &ce) || ce.Path != p {
				t.Errorf("%s: %v, want a CorruptError naming %s", what, err, p)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: reading hangs", what)
		}
	}
	os.Remove(p)
	if err := os.Symlink(outside, p); err != nil {
		t.Fatal(err)
	}
	check("link out of the root")
	os.Remove(p)
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	check("FIFO")
	os.Remove(p)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(3 << 30) // sparse
	f.Close()
	check("3 GB file")
}
