package state

import (
	"errors"
	"os"
	"testing"

	"github.com/kubeslot/kubeslot/lib/hostroot"
)

func TestSandboxRoundTrip(t *testing.T) {
	s, root, _ := newStore(t)
	if sb, err := s.LoadSandbox(); err != nil || !sb.IsZero() {
		t.Fatalf("no record: %+v %v", sb, err)
	}
	want := Sandbox{KubeletPort: 20250, HealthzPort: 20248, NodeIP: "127.0.0.2", ReadOnlyNetSysctl: true, HostPrep: "packages-only"}
	if err := s.SaveSandbox(want); err != nil {
		t.Fatal(err)
	}
	p, _ := root.Path("state", SandboxFile)
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: %v %v", p, fi, err)
	}
	if got, err := s.LoadSandbox(); err != nil || got != want {
		t.Errorf("round trip: %+v %v", got, err)
	}
	// A damaged record is an error, never production settings silently.
	if err := os.WriteFile(p, []byte(`{"kubeletPort": 1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var ce *hostroot.CorruptError
	if _, err := s.LoadSandbox(); !errors.As(err, &ce) {
		t.Errorf("damaged record: %v", err)
	}
	// A zero Sandbox removes the record.
	if err := s.SaveSandbox(Sandbox{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("record after saving zero settings: %v", err)
	}
	if err := s.RemoveSandbox(); err != nil {
		t.Errorf("removing an absent record: %v", err)
	}
}
