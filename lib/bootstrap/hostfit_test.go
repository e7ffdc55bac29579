package bootstrap

import (
	"os"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostprep"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

// A fresh host whose host preparation is blocked (here: software missing on
// an image-based host) is refused before anything exists, the lock and the
// ownership record included, with hostprep's error and exit 78; --preflight
// names the distribution. Once the plan is clear the same run installs.
func TestBlockedHostPreparationChangesNothing(t *testing.T) {
	f := newFakes(t)
	cfg := testConfig(t, "worker-1")
	d := f.deps()
	f.plan = &hostprep.Plan{
		Distro: hostprep.Distro{ID: "flatcar", Name: "Flatcar Container Linux", Family: hostprep.FamilyImage, Evidence: "os-release ID=flatcar"},
		Steps: []hostprep.Step{{Kind: hostprep.KindSoftware, Target: "systemd-container", Needed: true,
			Blocked: "missing command machinectl; provide it with a systemd-sysext image"}},
	}
	var out strings.Builder
	if err := Preflight(t.Context(), d, cfg, &out); err == nil ||
		!strings.Contains(out.String(), "host distribution: Flatcar Container Linux (ID flatcar; image-based: kubeslot installs nothing here") ||
		!strings.Contains(out.String(), "BLOCKED  software") {
		t.Errorf("preflight: %v\n%s", err, out.String())
	}
	_, err := Run(t.Context(), d, cfg)
	if exitcode.Of(err) != exitcode.HostUnfit || !strings.Contains(err.Error(), "ID flatcar") ||
		!strings.Contains(err.Error(), "machinectl") || !strings.Contains(err.Error(), "nothing was changed") {
		t.Fatalf("run: %v (exit %d), want exit %d naming the distribution and what is missing", err, exitcode.Of(err), exitcode.HostUnfit)
	}
	if got := f.Calls(); len(got) != 0 {
		t.Errorf("refused run called %v", got)
	}
	if ents, _ := os.ReadDir(f.root.Prefix()); len(ents) != 0 {
		t.Errorf("refused run created %v", ents)
	}

	f.plan = &hostprep.Plan{Distro: f.plan.Distro, Steps: []hostprep.Step{{Kind: hostprep.KindSoftware, Target: "systemd-container", Action: "present"}}}
	res, err := Run(t.Context(), d, cfg)
	if err != nil || res.Checkpoint != ownership.CheckpointComplete {
		t.Fatalf("run with the software present: %+v, %v", res, err)
	}
}
