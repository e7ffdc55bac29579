package host

// --systemd-bus on the rig: a stage run with a root prefix other than / reaches the systemd whose
// bus it is given, never this machine's own, and without a bus it changes nothing there.

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/integration/sdhost"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
)

// busProbeUnit is a worker unit the resetter stops first; here it only sleeps.
const busProbeUnit = "kubeslot-restart.service"

// TestSystemdBusReachesTheGivenHost runs kubeslot-resetter against a booted test host's root, with and without
// that host's bus. Without it the resetter refuses and the host's running worker unit keeps running; with it the
// resetter stops that unit inside the host, and this machine's own systemd sees no change to a unit of that name.
func TestSystemdBusReachesTheGivenHost(t *testing.T) {
	bins := rig.NeedBins(t)
	h := rig.StartHost(t, sdhost.Options{Name: rig.HostName("sdbus")})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	if err := h.InstallUnit(ctx, busProbeUnit, []byte("[Service]\nExecStart=/bin/sleep infinity\n")); err != nil {
		t.Fatal(err)
	}
	if out, err := h.Run(ctx, "systemctl", "start", busProbeUnit); err != nil {
		t.Fatalf("start %s in the host: %v: %s", busProbeUnit, err, out)
	}
	hostState := func() string {
		out, _ := h.Run(ctx, "systemctl", "show", "-p", "ActiveState", "--value", busProbeUnit)
		return strings.TrimSpace(string(out))
	}
	ownState := func() string {
		out, _ := exec.CommandContext(ctx, "systemctl", "show", "-p", "LoadState,ActiveState,InvocationID", busProbeUnit).CombinedOutput()
		return strings.TrimSpace(string(out))
	}
	if s := hostState(); s != "active" {
		t.Fatalf("%s in the host: %q before the run, want active", busProbeUnit, s)
	}
	ownBefore := ownState()

	// A completed installation in the host's root, as the resetter expects one.
	prefix := h.Root()
	testhost.Installed(t, testkit.RootAt(t, prefix), testhost.Example(t))

	resetter := func(extra ...string) (string, error) {
		rctx, rcancel := context.WithTimeout(ctx, 90*time.Second)
		defer rcancel()
		args := append([]string{"--root-prefix", prefix, "--yes", "--lock-wait", "5s"}, extra...)
		cmd := exec.CommandContext(rctx, filepath.Join(bins, "kubeslot-resetter"), args...)
		cmd.Env = testkit.CleanEnv()
		out, err := cmd.CombinedOutput()
		t.Logf("kubeslot-resetter %v: %v\n%s", args, err, out)
		return string(out), err
	}

	// No bus: refused, and the host's unit still runs.
	out, err := resetter()
	if err == nil || !strings.Contains(out, "--systemd-bus") {
		t.Fatalf("resetter without a bus: %v, want a refusal naming --systemd-bus", err)
	}
	if s := hostState(); s != "active" {
		t.Fatalf("%s in the host is %q after a refused run", busProbeUnit, s)
	}

	// The host's bus: the host's unit is stopped. The rest of the reset may fail (the host has no node); the stop
	// is what shows where the resetter's systemd calls went.
	_, _ = resetter("--systemd-bus", "unix:path="+prefix+"/run/dbus/system_bus_socket")
	if s := hostState(); s != "inactive" && s != "failed" {
		t.Errorf("%s in the host is %q after a run with its bus, want it stopped there", busProbeUnit, s)
	}
	if after := ownState(); after != ownBefore {
		t.Errorf("this machine's own %s changed: %q, was %q", busProbeUnit, after, ownBefore)
	}
}
