package hostroot

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/exitcode"
)

// TestCheckLayout: no marker and this release's version pass; any other
// version, or a damaged marker, is a *LayoutError with exit 78 whose text
// says what to do.
func TestCheckLayout(t *testing.T) {
	r, prefix := newRoot(t)
	if err := r.CheckLayout(); err != nil {
		t.Fatalf("no marker: %v", err)
	}
	marker := filepath.Join(prefix, "opt/kubeslot", LayoutFile)
	if err := os.MkdirAll(filepath.Dir(marker), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		text, want string // want "" passes
	}{
		{"1\n", ""},
		{"2\n", "a newer release laid this host out"},
		{"7", "layout version 7, this release understands 1"},
		{"0", "is not a positive integer"},
		{"two", "is not a positive integer"},
	} {
		if err := os.WriteFile(marker, []byte(c.text), 0o644); err != nil {
			t.Fatal(err)
		}
		err := r.CheckLayout()
		if c.want == "" {
			if err != nil {
				t.Errorf("marker %q: %v", c.text, err)
			}
			continue
		}
		var le *LayoutError
		if !errors.As(err, &le) || exitcode.Of(err) != exitcode.HostUnfit || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), marker) {
			t.Errorf("marker %q: %v (exit %d); want a LayoutError, exit %d, naming %s and saying %q", c.text, err, exitcode.Of(err), exitcode.HostUnfit, marker, c.want)
		}
	}
}

// TestEnsureLayoutRecordsTheParentsItMade: the first EnsureLayout records
// the directories it made above the base, a later one leaves the record
// alone, and a record naming anything but an ancestor of the base is
// refused.
func TestEnsureLayoutRecordsTheParentsItMade(t *testing.T) {
	prefix := t.TempDir()
	r, err := New(prefix, "/data/deep/kubeslot")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.EnsureLayout(); err != nil {
		t.Fatal(err)
	}
	if ps, err := r.LoadParents(); err != nil || !slices.Equal(ps, []string{"/data", "/data/deep"}) {
		t.Fatalf("parents after the first layout: %v %v", ps, err)
	}
	if err := r.EnsureLayout(); err != nil {
		t.Fatal(err)
	}
	if ps, _ := r.LoadParents(); !slices.Equal(ps, []string{"/data", "/data/deep"}) {
		t.Errorf("parents after a second layout: %v", ps)
	}
	for _, bad := range []string{"/etc", "/data/deep/kubeslot", "/data/../etc", "/"} {
		if err := r.SaveParents([]string{bad}); err != nil {
			t.Fatal(err)
		}
		if ps, err := r.LoadParents(); err == nil {
			t.Errorf("a list naming %q was taken: %v", bad, ps)
		}
	}
	existing, _ := New(prefix, "/data/other")
	if err := existing.EnsureLayout(); err != nil {
		t.Fatal(err)
	}
	if ps, err := existing.LoadParents(); err != nil || ps != nil {
		t.Errorf("a base under an existing directory recorded %v %v", ps, err)
	}
}
