package state

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
		{"file missing", func(p string) { os.Remove(p) }, "missing, but its checksum file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "doc.json")
			if err := WriteChecksummed(p, []byte(`{"a":1}`), 0o600); err != nil {
				t.Fatal(err)
			}
			c.damage(p)
			_, err := ReadChecksummed(p)
			var ce *CorruptError
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
