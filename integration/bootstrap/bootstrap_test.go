package bootstrap

// The bootstrap stage for real: on an isolated host the first-boot unit turns a bare host
// into a Ready node on slot a, reports AgentBootstrapped=True on the Machine, installs and enables the units and
// starts the watcher (when this release has it); plus the faults: invalid config, a different machine, a complete
// re-run, a deleted unit file, kill -9 at each phase, a power cut mid-bootstrap, a rootfs and a kubelet checksum
// mismatch, a rootfs tarball climbing out with "../", the sandbox settings recorded for later stages, and the
// Machine API taking an OCI rootfs.
// Rig setup: integration/rig (rig.go).

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/kubeslot/kubeslot/integration/mirror"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/bootstrap"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/units"
)

func TestBootstrapOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	r := rig.New(t, ctx, "bs", false)

	// 1. Invalid config: exit 1 naming the field, nothing changed on the host.
	before := r.Tree(ctx)
	bad := strings.Replace(r.Config("", ""), `version = "1.37.2"`, `version = "latest"`, 1)
	if err := r.H.WriteFile("/etc/kubeslot/bad.toml", []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out := r.Run(ctx, "--config=/etc/kubeslot/bad.toml")
	if code != 1 || !strings.Contains(out, "kubernetes.version") {
		t.Errorf("invalid config: exit %d, want 1 naming kubernetes.version:\n%s", code, out)
	}
	if after := r.Tree(ctx); after != before {
		t.Errorf("invalid config changed the host:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// 2. Preflight: reports, changes nothing.
	code, out = r.Run(ctx, "--preflight", "--config="+rig.ConfigPath)
	t.Logf("preflight (exit %d):\n%s", code, out)
	if code != 0 || !strings.Contains(out, "fresh installation") || !strings.Contains(out, "systemd-container") {
		t.Errorf("preflight: exit %d:\n%s", code, out)
	}
	if after := r.Tree(ctx); after != before {
		t.Errorf("preflight changed the host:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// 3. The first-boot unit on a fresh host whose artifact cache already has the rootfs and the kubelet (the
	// benchmark; the other tests download them from the mirror).
	r.SeedCache(ctx)
	t0 := time.Now()
	if err := r.StartUnit(ctx); err != nil {
		t.Fatalf("bootstrap unit: %v", err)
	}
	rig.Timing(t, "bootstrap: first-boot unit to complete (artifacts cached; Node Ready included)", time.Since(t0))
	r.CheckComplete(ctx, t0)
	// What systemctl status shows: the run's last STATUS= line (sd_notify, accepted from the unit's main process).
	if out, err := r.H.Run(ctx, "systemctl", "show", "-p", "StatusText", "--value", units.Bootstrap); err != nil ||
		!strings.HasPrefix(strings.TrimSpace(string(out)), "complete: installation ") || !strings.Contains(string(out), "installed") {
		t.Errorf("the bootstrap unit's status text: %q, %v; want its last STATUS= line", out, err)
	}
	for _, name := range []string{"node-rootfs.tar.gz", "kubelet"} {
		if n := r.Srv.Hits(name); n != 0 {
			t.Errorf("%s fetched %d times although it was in the cache", name, n)
		}
	}

	// 4. A complete re-run is a fast no-op.
	snap := r.Tree(ctx)
	t1 := time.Now()
	code, out = r.Run(ctx, "--config="+rig.ConfigPath)
	rig.Timing(t, "bootstrap: complete re-run (incl. nsenter)", time.Since(t1))
	t.Logf("complete re-run output (its own \"took\" excludes process start and nsenter):\n%s", out)
	if code != 0 || !strings.Contains(out, "nothing to do") {
		t.Errorf("complete re-run: exit %d:\n%s", code, out)
	}
	if after := r.Tree(ctx); after != snap {
		t.Errorf("complete re-run changed the host:\nbefore:\n%s\nafter:\n%s", snap, after)
	}

	// 5. A deleted unit file is back after a re-run, from the applied configuration.
	if out, err := r.H.Run(ctx, "rm", "/etc/systemd/system/"+units.Bootstrap); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	code, out = r.Run(ctx, "--config="+rig.ConfigPath)
	if code != 0 || !strings.Contains(out, "repaired") {
		t.Errorf("repair run: exit %d:\n%s", code, out)
	}
	if _, err := r.H.ReadFile("/etc/systemd/system/" + units.Bootstrap); err != nil {
		t.Errorf("deleted unit not repaired: %v", err)
	}
	// The same tree, except the record: the re-written unit is kubeslot's now, journalled so reset removes it.
	if after := r.Tree(ctx); withoutRecord(after) != withoutRecord(snap) {
		t.Errorf("after repair the host differs from the complete install:\nbefore:\n%s\nafter:\n%s", snap, after)
	}
	if rec, err := r.Record(); err != nil {
		t.Error(err)
	} else if _, ok := rec.Lookup(ownership.KindUnit, "/etc/systemd/system/"+units.Bootstrap); !ok {
		t.Errorf("repaired unit file not journalled")
	}
	snap = r.Tree(ctx)

	// 6. A second bootstrap with a different machine name: refused, host untouched.
	if err := r.H.WriteFile("/etc/kubeslot/other.toml", []byte(r.Config("other-machine", "")), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out = r.Run(ctx, "--config=/etc/kubeslot/other.toml")
	if code != 1 || !strings.Contains(out, "different installation") {
		t.Errorf("different machine: exit %d, want 1 and a refusal:\n%s", code, out)
	}
	if after := r.Tree(ctx); after != snap {
		t.Errorf("refused bootstrap changed the host:\nbefore:\n%s\nafter:\n%s", snap, after)
	}
}

// TestBootstrapKillAtEachPhase: kill -9 of the bootstrap at the start of each phase, then a re-run that resumes
// with the same install ID; the last re-run is the first-boot unit, which finishes the job.
func TestBootstrapKillAtEachPhase(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	r := rig.New(t, ctx, "bsk", false)
	var id string
	for i, cp := range ownership.InstallCheckpoints() {
		unit := fmt.Sprintf("kubeslot-bs-pause-%d", i)
		r.PauseAt(ctx, unit, cp)
		rec, err := r.Record()
		if err != nil {
			t.Fatal(err)
		}
		if rec.Checkpoint != cp && !(cp == ownership.CheckpointComplete && rec.Checkpoint == ownership.CheckpointInstallingUnits) {
			t.Errorf("paused at %s with checkpoint %s on disk", cp, rec.Checkpoint)
		}
		if id == "" {
			id = rec.InstallID
		} else if rec.InstallID != id {
			t.Errorf("install ID changed after kill -9 at %s: %s -> %s", cp, id, rec.InstallID)
		}
		if out, err := r.H.Run(ctx, "systemctl", "kill", "-s", "KILL", unit); err != nil {
			t.Fatalf("kill -9 at %s: %v\n%s", cp, err, out)
		}
		t.Logf("killed the bootstrap at %s (install %s)", cp, rec.InstallID)
	}
	t0 := time.Now()
	if err := r.StartUnit(ctx); err != nil {
		t.Fatalf("bootstrap unit after the kills: %v", err)
	}
	rig.Timing(t, "bootstrap: resume from installing-units to complete", time.Since(t0))
	rec, err := r.Record()
	if err != nil || rec.Checkpoint != ownership.CheckpointComplete || rec.InstallID != id {
		t.Fatalf("record after resume: %+v %v; want complete, install %s", rec, err, id)
	}
	r.CheckComplete(ctx, t0)
}

// TestBootstrapHostRebootMidway: a power cut while the bootstrap is at starting-node; on the next boot the
// first-boot unit finishes the job with the same install ID. Also the benchmark: the second attempt has the
// artifacts cached.
func TestBootstrapHostRebootMidway(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	r := rig.New(t, ctx, "bsr", true)
	r.PauseAt(ctx, "kubeslot-bs-pause", ownership.CheckpointStartingNode)
	rec, err := r.Record()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.H.Kill(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := r.H.Boot(ctx); err != nil {
		t.Fatalf("boot again: %v", err)
	}
	// The enabled first-boot unit runs at boot; wait for it to finish.
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Minute)
	defer wcancel()
	for {
		out, _ := r.H.Run(wctx, "systemctl", "show", "-p", "ActiveState", "-p", "Result", units.Bootstrap)
		s := string(out)
		if strings.Contains(s, "ActiveState=active") {
			break
		}
		if strings.Contains(s, "ActiveState=failed") {
			j, _ := r.H.Journal(wctx, units.Bootstrap)
			t.Fatalf("first-boot unit failed after the power cut:\n%s", rig.TailLines(j, 60))
		}
		select {
		case <-wctx.Done():
			j, _ := r.H.Journal(ctx, units.Bootstrap)
			t.Fatalf("first-boot unit did not finish after the power cut (%s):\n%s", s, rig.TailLines(j, 60))
		case <-time.After(500 * time.Millisecond):
		}
	}
	rig.Timing(t, "bootstrap: boot after power cut to complete (artifacts cached)", time.Since(t0))
	after, err := r.Record()
	if err != nil || after.Checkpoint != ownership.CheckpointComplete || after.InstallID != rec.InstallID {
		t.Fatalf("record after reboot: %+v %v; want complete, install %s", after, err, rec.InstallID)
	}
	r.CheckComplete(ctx, t0)

	// Another power cut on the complete host: the node comes back by itself (systemd-nspawn@a enabled at boot),
	// and the first-boot unit only verifies.
	if err := r.H.Kill(); err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	if err := r.H.Boot(ctx); err != nil {
		t.Fatalf("boot again: %v", err)
	}
	rig.WaitNodeHeartbeat(t, ctx, r.Admin, r.Node, t1, 3*time.Minute, r.H)
	rig.Timing(t, "bootstrap: complete host power cut to Node Ready with a new heartbeat", time.Since(t1))
	for {
		out, _ := r.H.Run(ctx, "systemctl", "show", "-p", "ActiveState", units.Bootstrap)
		if strings.Contains(string(out), "ActiveState=active") || ctx.Err() != nil {
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	// Match the stage's own journal field as well as the unit: a run this short can exit before journald reads
	// its cgroup, and its records then carry no _SYSTEMD_UNIT for `journalctl -u` to match. Records may also
	// arrive a moment after the unit finished, so look again for a bounded while.
	var j []byte
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		j, _ = r.H.Run(ctx, "journalctl", "--no-pager", "-q", "KUBESLOT_STAGE=kubeslot-bootstrap")
		if strings.Contains(string(j), "nothing to do") || time.Now().After(deadline) {
			break
		}
	}
	if !strings.Contains(string(j), "nothing to do") {
		u, _ := r.H.Run(ctx, "journalctl", "-u", units.Bootstrap, "--no-pager", "-q")
		t.Errorf("the first-boot unit on a complete host did not just verify:\n%s\nunit journal:\n%s", rig.TailLines(string(j), 30), rig.TailLines(string(u), 30))
	}
	if out, err := r.H.Run(ctx, "systemctl", "is-active", "systemd-nspawn@a.service"); err != nil {
		t.Errorf("node machine not running after the reboot: %v %s", err, out)
	}
}

// TestBootstrapRootfsChecksumMismatch: the mirror serves a rootfs that does not match the configured digest:
// refused at preparing-slot, no slot installed, nothing in the cache.
func TestBootstrapRootfsChecksumMismatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	r := rig.New(t, ctx, "bsc", false)
	wrong := strings.Repeat("0", 64)
	if err := r.H.WriteFile(rig.ConfigPath, []byte(r.Config("", wrong)), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out := r.Run(ctx, "--config="+rig.ConfigPath)
	if code != 1 || !strings.Contains(out, "preparing-slot") || !strings.Contains(strings.ToLower(out), "sha256") {
		t.Errorf("checksum mismatch: exit %d, want 1 naming the phase and the digest:\n%s", code, rig.TailLines(out, 20))
	}
	for _, p := range []string{"/var/lib/machines/a", "/var/lib/machines/.a.partial", "/etc/systemd/nspawn/a.nspawn"} {
		if out, err := r.H.Run(ctx, "test", "-e", p); err == nil {
			t.Errorf("%s installed despite the mismatch %s", p, out)
		}
	}
	if out, err := r.H.Run(ctx, "sh", "-c", "find /opt/kubeslot/cache -type f | grep -v "+r.Sums["kubelet"]+" || true"); err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("cache holds more than the verified kubelet after the mismatch: %v\n%s", err, out)
	}
	rec, err := r.Record()
	if err != nil || rec.Checkpoint != ownership.CheckpointPreparingSlot {
		t.Errorf("record after the mismatch: %+v %v", rec, err)
	}
	// Before the node has an identity, status is only logged: the bootstrap token may not write Machines.
	if !strings.Contains(out, "status not reported to the cluster") {
		t.Errorf("the failure before the node identity was not logged as unreported:\n%s", rig.TailLines(out, 20))
	}
	if _, err := r.MC.GetMachine(ctx, r.Node); !apierrors.IsNotFound(err) {
		t.Errorf("Machine %s: %v, want none (nothing may report before the node identity exists)", r.Node, err)
	}
}

// withoutRecord drops the ownership record's line from a tree listing.
func withoutRecord(tree string) string {
	var keep []string
	for _, l := range strings.Split(tree, "\n") {
		if !strings.HasPrefix(l, "/opt/kubeslot/ownership.json ") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// TestBootstrapSandboxRecordedForLaterStages: the rig's sandbox settings reach the first-boot unit by its drop-in
// only; the bootstrap records them (<base>/state/sandbox.json), so a later stage started with none of that
// environment (here the repaver, by hand through systemd-run: no drop-in, no KUBESLOT_* variable) still renders the
// rig's kubelet ports, node IP and read-only /proc/sys/net into the new slot, and the node comes up on them.
func TestBootstrapSandboxRecordedForLaterStages(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	r := rig.New(t, ctx, "bss", false)
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if r.H.Running() {
			_, _ = r.H.Run(sctx, "systemctl", "stop", "systemd-nspawn@b.service")
		}
	})
	r.SeedCache(ctx)
	if err := r.StartUnit(ctx); err != nil {
		t.Fatalf("bootstrap unit: %v", err)
	}
	env := map[string]string{}
	for _, e := range r.Env {
		k, v, _ := strings.Cut(e, "=")
		env[k] = v
	}
	data, err := r.H.ReadFile("/opt/kubeslot/state/sandbox.json")
	if err != nil {
		t.Fatalf("sandbox settings not recorded: %v", err)
	}
	var sb state.Sandbox
	if err := json.Unmarshal(data, &sb); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(sb.KubeletPort) != env[bootstrap.EnvKubeletPort] || fmt.Sprint(sb.HealthzPort) != env[bootstrap.EnvHealthzPort] ||
		sb.NodeIP != "127.0.0.1" || !sb.ReadOnlyNetSysctl || sb.HostPrep != bootstrap.HostPrepPackagesOnly {
		t.Errorf("recorded sandbox settings %s, rig environment %v", data, r.Env)
	}

	// A repave with no sandbox environment at all.
	t1 := time.Now()
	out, err := r.H.Run(ctx, "systemd-run", "--unit=kubeslot-bss-repave", "--collect", "--wait", "--pipe",
		"/opt/kubeslot/current/kubeslot-repaver", "b")
	if err != nil {
		j, _ := r.H.Journal(ctx, "kubeslot-bss-repave")
		t.Fatalf("repave without the sandbox environment: %v\n%s\n%s", err, out, rig.TailLines(j, 40))
	}
	rig.Timing(t, "bootstrap sandbox: repave to b without the environment", time.Since(t1))
	cfgText, err := r.H.ReadFile("/var/lib/machines/b/etc/kubernetes/kubelet-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\nport: " + env[bootstrap.EnvKubeletPort] + "\n", "\nhealthzPort: " + env[bootstrap.EnvHealthzPort] + "\n"} {
		if !strings.Contains(string(cfgText), want) {
			t.Errorf("slot b's kubelet config lacks %q:\n%s", strings.TrimSpace(want), cfgText)
		}
	}
	if out, err := r.H.Run(ctx, "grep", "-rl", "--", "--node-ip=127.0.0.1", "/var/lib/machines/b/etc/systemd/system"); err != nil {
		t.Errorf("slot b's kubelet does not get the rig's node IP: %v %s", err, out)
	}
	dropIn, err := r.H.ReadFile("/etc/systemd/system/systemd-nspawn@b.service.d/kubeslot.conf")
	if err != nil || strings.Contains(string(dropIn), "SYSTEMD_NSPAWN_API_VFS_WRITABLE") {
		t.Errorf("slot b's node would get a writable /proc/sys/net (the machine's own network sysctls): %v\n%s", err, dropIn)
	}
	rig.WaitNodeHeartbeat(t, ctx, r.Admin, r.Node, t1, 3*time.Minute, r.H)
}

// TestBootstrapKubeletChecksumMismatch: the mirror corrupts the kubelet (same length, one byte flipped): the run
// fails in preparing-slot with a message that names the expected and the actual digest, no slot is installed, the
// bad download is not kept; once the mirror serves the right file, a re-run with the same configuration resumes
// and completes with the same install ID.
func TestBootstrapKubeletChecksumMismatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	r := rig.New(t, ctx, "bsm", false)
	r.Srv.SetFault("kubelet", mirror.Corrupt)
	code, out := r.Run(ctx, "--config="+rig.ConfigPath)
	if code != 1 || !strings.Contains(out, "preparing-slot") || !strings.Contains(out, "expected sha256 "+r.Sums["kubelet"]) ||
		!strings.Contains(out, ", got ") {
		t.Errorf("kubelet checksum mismatch: exit %d, want 1 naming preparing-slot and both digests:\n%s", code, rig.TailLines(out, 20))
	}
	for _, p := range []string{"/var/lib/machines/a", "/etc/systemd/nspawn/a.nspawn"} {
		if out, err := r.H.Run(ctx, "test", "-e", p); err == nil {
			t.Errorf("%s installed despite the mismatch %s", p, out)
		}
	}
	if out, err := r.H.Run(ctx, "sh", "-c", "find /opt/kubeslot/cache -type f | grep -v "+r.Sums["rootfs"]+" || true"); err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("cache holds more than the verified rootfs after the mismatch: %v\n%s", err, out)
	}
	rec, err := r.Record()
	if err != nil || rec.Checkpoint != ownership.CheckpointPreparingSlot {
		t.Fatalf("record after the mismatch: %+v %v", rec, err)
	}
	r.Srv.SetFault("kubelet", mirror.None)
	t0 := time.Now()
	if err := r.StartUnit(ctx); err != nil {
		t.Fatalf("bootstrap unit after the mirror was fixed: %v", err)
	}
	after, err := r.Record()
	if err != nil || after.Checkpoint != ownership.CheckpointComplete || after.InstallID != rec.InstallID {
		t.Fatalf("record after the resume: %+v %v; want complete, install %s", after, err, rec.InstallID)
	}
	r.CheckComplete(ctx, t0)
}

// TestBootstrapRootfsTarballEscape: a rootfs tarball (with the right digest) whose entries climb out of the slot
// with "../" is refused in preparing-slot, and nothing is written outside the directory it is unpacked into (the
// tree cache's partial tree): no slot, no escaped file anywhere on the host.
func TestBootstrapRootfsTarballEscape(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	r := rig.New(t, ctx, "bse", false)
	evil := filepath.Join(t.TempDir(), "evil.tar.gz")
	writeTarGz(t, evil, []tarEntry{
		{name: "etc/", dir: true},
		{name: "etc/os-release", body: "ID=debian\n"},
		{name: "../kubeslot-escape-1", body: "escaped\n"},
		{name: "etc/../../../../../../tmp/kubeslot-escape-2", body: "escaped\n"},
	})
	sum, err := r.Srv.Add("evil-rootfs.tar.gz", evil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := rig.NspawnRigConfig(r.Node, r.CP.URL(), string(r.CP.CAPEM()), r.Token, r.Srv.URL("evil-rootfs.tar.gz"), sum,
		r.Srv.URL("kubelet"), r.Sums["kubelet"])
	if err := r.H.WriteFile(rig.ConfigPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out := r.Run(ctx, "--config="+rig.ConfigPath)
	// The error is a quoted log value: its own quotes come escaped.
	if code != 1 || !strings.Contains(out, "preparing-slot") || !strings.Contains(out, "kubeslot-escape-1") ||
		!strings.Contains(out, "refused") || !strings.Contains(out, `..\" in the path`) {
		t.Errorf("escaping tarball: exit %d, want 1 naming preparing-slot and the refused \"..\" entry:\n%s", code, rig.TailLines(out, 20))
	}
	for _, p := range []string{"/var/lib/machines/kubeslot-escape-1", "/tmp/kubeslot-escape-2", "/kubeslot-escape-2",
		"/var/lib/machines/a", "/etc/systemd/nspawn/a.nspawn"} {
		if out, err := r.H.Run(ctx, "test", "-e", p); err == nil {
			t.Errorf("%s exists after the refused tarball %s", p, out)
		}
	}
	if out, _ := r.H.Run(ctx, "sh", "-c", "find / -xdev -name 'kubeslot-escape-*' 2>/dev/null; true"); strings.TrimSpace(string(out)) != "" {
		t.Errorf("escaped entries written: %s", out)
	}
	if rec, err := r.Record(); err != nil || rec.Checkpoint != ownership.CheckpointPreparingSlot {
		t.Errorf("record after the refused tarball: %+v %v", rec, err)
	}
}

type tarEntry struct {
	name, body string
	dir        bool
}

// writeTarGz writes entries, names as given (unsafe ones included), into a gzipped tarball at p.
func writeTarGz(t *testing.T, p string, entries []tarEntry) {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz := gzip.NewWriter(f)
	tw := tar.NewWriter(gz)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.body)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}
		if e.dir {
			h.Mode, h.Size, h.Typeflag = 0o755, 0, tar.TypeDir
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []io.Closer{tw, gz} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBootstrapMachineAcceptsOCIRootFS: the Machine API takes the rootfs sources the bootstrap configuration takes,
// an OCI image reference included; artifacts stay http(s) only.
func TestBootstrapMachineAcceptsOCIRootFS(t *testing.T) {
	cp := rig.NeedAPI(t)
	ctx := rig.APICtx(t)
	admin := rig.AdminAPI(t, cp)
	for i, src := range []string{
		"oci://registry.example/node/bookworm:1.37.2",
		"oci://127.0.0.1:5000/x",
		"oci://localhost/node",
		"oci://registry.example:5000/node/bookworm@sha256:" + string(rig.SampleSHA),
		"https://dl.example.com/rootfs.tar.zst",
	} {
		name := fmt.Sprintf("bs-oci-%d", i)
		m := rig.SampleMachine(name, name)
		m.Spec.Node.RootFS.Source = v1alpha1.URL(src)
		if _, err := admin.CreateMachine(ctx, m); err != nil {
			t.Errorf("rootfs source %s refused: %v", src, err)
			continue
		}
		_ = admin.DeleteMachine(ctx, name)
	}
	for _, c := range []struct {
		what   string
		mutate func(*v1alpha1.Machine)
		want   []string
	}{
		{"oci with credentials", func(m *v1alpha1.Machine) { m.Spec.Node.RootFS.Source = "oci://u:p@registry.example/node" },
			[]string{"spec.node.rootfs.source", "credentials"}},
		{"oci without a registry host", func(m *v1alpha1.Machine) { m.Spec.Node.RootFS.Source = "oci://node/bookworm" },
			[]string{"spec.node.rootfs.source", "registry host"}},
		{"oci uppercase repository", func(m *v1alpha1.Machine) { m.Spec.Node.RootFS.Source = "oci://registry.example/Node" },
			[]string{"spec.node.rootfs.source", "registry host"}},
		{"ftp rootfs", func(m *v1alpha1.Machine) { m.Spec.Node.RootFS.Source = "ftp://dl.example.com/rootfs.tar" },
			[]string{"spec.node.rootfs.source", "http or https URL"}},
		{"oci artifact", func(m *v1alpha1.Machine) { m.Spec.Node.Artifacts.Kubelet.URL = "oci://registry.example/kubelet" },
			[]string{"spec.node.artifacts.kubelet.url", "http or https URL"}},
	} {
		m := rig.SampleMachine("bs-oci-bad", "bs-oci-bad")
		c.mutate(m)
		_, err := admin.CreateMachine(ctx, m)
		rig.WantRejected(t, "Machine: "+c.what, err, apierrors.IsInvalid, c.want...)
		if err == nil {
			_ = admin.DeleteMachine(ctx, m.Name)
		}
	}
}
