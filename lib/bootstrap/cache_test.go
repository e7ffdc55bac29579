package bootstrap

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/artifact"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

// TestTidyCache: a bootstrap removes what a killed
// download left; a resumed installation keeps its downloads (the slot it
// builds is not applied yet), a complete host loses what nothing uses.
func TestTidyCache(t *testing.T) {
	for _, tc := range []struct {
		decision ownership.Decision
		want     []string
	}{
		{ownership.Resume, []string{strings.Repeat("e", 64)}},
		{ownership.Complete, nil},
	} {
		t.Run(tc.decision.String(), func(t *testing.T) {
			root := testkit.Root(t)
			dir, err := root.Path(hostroot.CacheDir, artifact.CacheSubdir)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, n := range []string{strings.Repeat("e", 64), "." + strings.Repeat("e", 64) + ".tmp-42"} {
				if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			tidyCache(Deps{Root: root, Log: slog.New(slog.DiscardHandler)}, tc.decision)
			es, _ := os.ReadDir(dir)
			var got []string
			for _, e := range es {
				got = append(got, e.Name())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("left %v, want %v", got, tc.want)
			}
		})
	}
}
