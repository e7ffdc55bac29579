package integration

// --systemd-bus on the rig (issue 17, item 2): a stage run with a root prefix other than / reaches the systemd whose
// bus it is given, never this machine's own, and without a bus it changes nothing there.

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/integration/sdhost"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/state"
)

// busProbeUnit is a worker unit the resetter stops first; here it only sleeps.
const busProbeUnit = "kubeslot-restart.service"

// TestSystemdBusReachesTheGivenHost runs kubeslot-resetter against a booted test host's root, with and without
// that host's bus. Without it the resetter refuses and the host's running worker unit keeps running; with it the
// resetter stops that unit inside the host, and this machine's own systemd sees no change to a unit of that name.
func TestSystemdBusReachesTheGivenHost(t *testing.T) {
	bins := needBins(t)
	h := startHost(t, sdhost.Options{Name: hostName("sdbus")})
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
	root, err := hostroot.New(prefix, "")
	if err != nil {
		t.Fatal(err)
	}
	installForBusProbe(t, root)

	resetter := func(extra ...string) (string, error) {
		rctx, rcancel := context.WithTimeout(ctx, 90*time.Second)
		defer rcancel()
		args := append([]string{"--root-prefix", prefix, "--yes", "--lock-wait", "5s"}, extra...)
		cmd := exec.CommandContext(rctx, filepath.Join(bins, "kubeslot-resetter"), args...)
		cmd.Env = cleanKubeslotEnv()
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

// installForBusProbe lays down a completed installation (record, applied slot a, active) under root.
func installForBusProbe(t *testing.T, root *hostroot.Root) {
	t.Helper()
	if err := root.EnsureLayout(); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("example.toml", config.Example())
	if err != nil {
		t.Fatal(err)
	}
	rec, err := ownership.New(cfg.Machine.Name, cfg.Fingerprint(), "v0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	rec.Checkpoint = ownership.CheckpointComplete
	if err := ownership.Save(root, rec); err != nil {
		t.Fatal(err)
	}
	store := state.NewStore(root)
	if err := store.SaveApplied(&state.Applied{Slot: "a", Mode: "nspawn", Fingerprint: cfg.Fingerprint(), AgentVersion: "v0.1.0",
		AppliedAt: time.Now(), Config: cfg}); err != nil {
		t.Fatal(err)
	}
	if err := store.SetActive("a"); err != nil {
		t.Fatal(err)
	}
}

// cleanKubeslotEnv is this process's environment without kubeslot's own settings (a KUBESLOT_SYSTEMD_BUS of the
// caller's would defeat the test) and without the journal's, so logs come back on stderr.
func cleanKubeslotEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KUBESLOT_") && !strings.HasPrefix(kv, "INVOCATION_ID=") && !strings.HasPrefix(kv, "JOURNAL_STREAM=") {
			out = append(out, kv)
		}
	}
	return out
}
