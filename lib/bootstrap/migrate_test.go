package bootstrap

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/units"
)

// TestRunMovesInstallationFromOtherBase: a complete installation at the
// default base; the next run given another base moves it there in
// admission and treats it as complete (no install phase, no node start),
// its units naming the new base; the run after finds nothing to move.
func TestRunMovesInstallationFromOtherBase(t *testing.T) {
	f := newFakes(t)
	cfg := testConfig(t, "worker-1")
	first, err := Run(t.Context(), f.deps(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	const newBase = "/srv/kubeslot"
	to, err := hostroot.New(f.root.Prefix(), newBase)
	if err != nil {
		t.Fatal(err)
	}
	f.root = to
	f.reset()
	// Not a fresh host: preflight names the move, and the checks of a
	// fresh host (here a sandbox image no registry serves) do not stop it.
	d := f.deps()
	var out strings.Builder
	if err := Preflight(t.Context(), d, cfg, &out); !strings.Contains(out.String(),
		"admission: change: the installation at "+hostroot.DefaultBase+" would be moved to "+newBase) {
		t.Errorf("preflight before the move (%v):\n%s", err, out.String())
	}
	d.ResolveImage = (&fakeRegistry{}).resolve
	res, err := Run(t.Context(), d, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Decision != ownership.Complete || res.InstallID != first.InstallID {
		t.Errorf("run at the new base: %+v, want the moved installation %s, complete", res, first.InstallID)
	}
	if got := f.Calls(); !slices.Equal(got, []string{"hostprep@complete", "hooks@complete"}) {
		t.Errorf("calls of the migrating run: %v, want only a complete host's checks (the node never restarted)", got)
	}
	if _, err := os.Lstat(filepath.Join(f.root.Prefix(), hostroot.DefaultBase)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("old base still there: %v", err)
	}
	if !slices.Contains(f.sd.Calls(), "stop "+units.Watcher) || !slices.Contains(f.started(), units.Watcher) {
		t.Errorf("the watcher was not stopped for the move and started again: calls %v, started %v", f.sd.Calls(), f.started())
	}
	unit, err := os.ReadFile(filepath.Join(f.root.Prefix(), hostroot.UnitDir, units.Watcher))
	if err != nil || !strings.Contains(string(unit), "KUBESLOT_HOST_ROOT="+newBase+"\n") || strings.Contains(string(unit), hostroot.DefaultBase) {
		t.Errorf("watcher unit after the move (%v):\n%s", err, unit)
	}
	f.reset()
	if res, err := Run(t.Context(), f.deps(), cfg); err != nil || res.Decision != ownership.Complete || slices.Contains(f.sd.Calls(), "stop "+units.Watcher) {
		t.Errorf("run after the move: %+v %v; systemd calls %v", res, err, f.sd.Calls())
	}
}
