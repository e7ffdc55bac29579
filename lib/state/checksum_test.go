package state

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/hostroot"
)

func TestChecksummedRoundTrip(t *testing.T) {
	p := filepath.Join(t.TempDir(), "doc.json")
	if err := WriteChecksummed(p, []byte(`{"a":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := ReadChecksummed(p)
	if err != nil || string(got) != `{"a":1}` {
		t.Fatalf("got %q, %v", got, err)
	}
	for _, f := range []string{p, p + SidecarSuffix} {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", f, fi.Mode().Perm())
		}
	}
	side, _ := os.ReadFile(p + SidecarSuffix)
	if !strings.HasSuffix(strings.TrimSpace(string(side)), "  doc.json") {
		t.Errorf("sidecar is not in sha256sum format: %q", side)
	}
}

func TestChecksummedDamage(t *testing.T) {
	cases := []struct {
		name   string
		damage func(p string)
		want   string
	}{
		{"mismatch", func(p string) { os.WriteFile(p, []byte(`{"a":2}`), 0o600) }, "checksum mismatch"},
		{"truncated", func(p string) { os.Truncate(p, 3) }, "checksum mismatch"},
		{"sidecar missing", func(p string) { os.Remove(p + SidecarSuffix) }, "is missing"},
		{"sidecar malformed", func(p string) { os.WriteFile(p+SidecarSuffix, []byte("zz  doc.json\n"), 0o600) }, "malformed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "doc.json")
			if err := WriteChecksummed(p, []byte(`{"a":1}`), 0o600); err != nil {
				t.Fatal(err)
			}
			c.damage(p)
			_, err := ReadChecksummed(p)
			var ce *hostroot.CorruptError
			if !errors.As(err, &ce) {
				t.Fatalf("got %v, want CorruptError", err)
			}
			if !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "reset") {
				t.Errorf("error should name %s, say %q and what to do: %v", p, c.want, err)
			}
		})
	}
}

func TestChecksummedAbsent(t *testing.T) {
	_, err := ReadChecksummed(filepath.Join(t.TempDir(), "none"))
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("got %v", err)
	}
	p := filepath.Join(t.TempDir(), "doc")
	if err := WriteChecksummed(p, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := RemoveChecksummed(p); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadChecksummed(p); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after remove: %v", err)
	}
	if err := RemoveChecksummed(p); err != nil {
		t.Fatalf("second remove: %v", err)
	}
}

// TestChecksummedCrashPoints: a write or a removal killed between any two
// of its steps leaves a pair that reads as the old content, the new one, or
// not found; never a corruption that wedges later stages.
func TestChecksummedCrashPoints(t *testing.T) {
	old, new := []byte(`{"v":1}`), []byte(`{"v":2}`)
	setup := func(t *testing.T) string {
		p := filepath.Join(t.TempDir(), "doc.json")
		if err := WriteChecksummed(p, old, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	sidecar := func(data []byte) []byte {
		sum := sha256.Sum256(data)
		return []byte(hex.EncodeToString(sum[:]) + "  doc.json\n")
	}
	t.Run("write: after the pending sidecar", func(t *testing.T) {
		p := setup(t)
		os.WriteFile(p+pendingSuffix, sidecar(new), 0o600)
		if got, err := ReadChecksummed(p); err != nil || string(got) != string(old) {
			t.Errorf("read %q %v, want the old content", got, err)
		}
	})
	t.Run("write: after the data", func(t *testing.T) {
		p := setup(t)
		os.WriteFile(p+pendingSuffix, sidecar(new), 0o600)
		os.WriteFile(p, new, 0o600)
		if got, err := ReadChecksummed(p); err != nil || string(got) != string(new) {
			t.Errorf("read %q %v, want the new content", got, err)
		}
		if err := WriteChecksummed(p, old, 0o600); err != nil { // the next write starts over cleanly
			t.Fatal(err)
		}
		if got, err := ReadChecksummed(p); err != nil || string(got) != string(old) {
			t.Errorf("after the next write: %q %v", got, err)
		}
	})
	t.Run("write: a stale pending sidecar does not vouch for other data", func(t *testing.T) {
		p := setup(t)
		os.WriteFile(p+pendingSuffix, sidecar(new), 0o600)
		os.WriteFile(p, []byte(`{"v":3}`), 0o600)
		var ce *hostroot.CorruptError
		if _, err := ReadChecksummed(p); !errors.As(err, &ce) {
			t.Errorf("hand-edited data accepted: %v", err)
		}
	})
	t.Run("remove: after the data", func(t *testing.T) {
		p := setup(t)
		os.Remove(p)
		if _, err := ReadChecksummed(p); !errors.Is(err, ErrNotFound) {
			t.Errorf("read %v, want not found", err)
		}
		if err := RemoveChecksummed(p); err != nil {
			t.Errorf("the removal does not finish: %v", err)
		}
		if _, err := os.Stat(p + SidecarSuffix); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("sidecar left: %v", err)
		}
	})
}
