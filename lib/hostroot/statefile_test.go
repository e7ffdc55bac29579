package hostroot

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type doc struct {
	Name string `json:"name"`
}

func TestStateFile(t *testing.T) {
	r, err := New(t.TempDir(), DefaultBase)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.EnsureLayout(); err != nil {
		t.Fatal(err)
	}
	f := StateFile[doc]{Dir: StateDir, Name: "doc.json", Max: 64, Perm: 0o600, Advice: "fix it",
		Validate: func(d *doc) error {
			if d.Name == "" {
				return errors.New("no name")
			}
			return nil
		}}
	p, err := f.Path(r)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := f.Load(r); d != nil || err != nil {
		t.Fatalf("absent: %v %v", d, err)
	}
	if err := f.Remove(r); err != nil {
		t.Fatalf("remove absent: %v", err)
	}
	if err := f.Save(r, &doc{}); err == nil || !strings.Contains(err.Error(), "no name") {
		t.Fatalf("an invalid value saved: %v", err)
	}
	if err := f.Save(r, &doc{Name: "x"}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode: %v %v", fi, err)
	}
	if d, err := f.Load(r); err != nil || d == nil || d.Name != "x" {
		t.Fatalf("round trip: %v %v", d, err)
	}
	for _, c := range []struct {
		what    string
		write   func() error
		wantErr error
	}{
		{"not JSON", func() error { return os.WriteFile(p, []byte("{"), 0o600) }, ErrNotJSON},
		{"refused", func() error { return os.WriteFile(p, []byte(`{"name":""}`), 0o600) }, nil},
		{"too large", func() error { return os.WriteFile(p, []byte(`{"name":"`+strings.Repeat("x", 64)+`"}`), 0o600) }, ErrTooLarge},
		{"a link", func() error {
			os.Remove(p)
			return os.Symlink(filepath.Join(filepath.Dir(p), "elsewhere"), p)
		}, ErrNotRegular},
	} {
		if err := c.write(); err != nil {
			t.Fatal(err)
		}
		d, err := f.Load(r)
		var ce *CorruptError
		if d != nil || !errors.As(err, &ce) || ce.Path != p || !strings.HasSuffix(err.Error(), ": fix it") {
			t.Errorf("%s: %v %v, want a CorruptError naming %s with the advice", c.what, d, err, p)
		}
		if c.wantErr != nil && !errors.Is(err, c.wantErr) {
			t.Errorf("%s: %v, want it to wrap %v", c.what, err, c.wantErr)
		}
	}
	if err := f.Remove(r); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(p); !os.IsNotExist(err) {
		t.Fatalf("not removed: %v", err)
	}
}
