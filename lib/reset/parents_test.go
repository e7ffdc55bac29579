package reset

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// TestResetRemovesTheParentsItMade: a base kubeslot made with the
// directories above it (/data/deep for /data/deep/kubeslot) leaves none of
// them after a reset's last step; a parent that holds something else, and
// a system directory, stay.
func TestResetRemovesTheParentsItMade(t *testing.T) {
	for _, tc := range []struct {
		name, base, foreign string
		gone, kept          []string
	}{
		{"all made", "/data/deep/kubeslot", "", []string{"/data/deep", "/data"}, nil},
		{"outer holds a file", "/data/deep/kubeslot", "/data/operator.txt", []string{"/data/deep"}, []string{"/data"}},
		{"system directory", "/srv/kubeslot", "", nil, []string{"/srv"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := t.TempDir()
			root, err := hostroot.New(prefix, tc.base)
			if err != nil {
				t.Fatal(err)
			}
			if err := root.EnsureLayout(); err != nil {
				t.Fatal(err)
			}
			if tc.foreign != "" {
				if err := os.WriteFile(filepath.Join(prefix, tc.foreign), []byte("x"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			// What the steps before leave: the base empty but for the list.
			ents, _ := os.ReadDir(filepath.Join(prefix, tc.base))
			for _, e := range ents {
				if e.Name() != hostroot.ParentsFile {
					if err := os.RemoveAll(filepath.Join(prefix, tc.base, e.Name())); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := removeEmptyBase(root, slog.New(slog.DiscardHandler)); err != nil {
				t.Fatal(err)
			}
			for _, p := range append([]string{tc.base}, tc.gone...) {
				if _, err := os.Lstat(filepath.Join(prefix, p)); !os.IsNotExist(err) {
					t.Errorf("%s is still there (%v)", p, err)
				}
			}
			for _, p := range tc.kept {
				if _, err := os.Lstat(filepath.Join(prefix, p)); err != nil {
					t.Errorf("%s was removed: %v", p, err)
				}
			}
		})
	}
}
