package hostroot

import (
	"errors"
	"os"
	"path/filepath"
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
