package host

// Tests of the isolated systemd host (integration/sdhost) itself: that it is a real, isolated systemd, that unit
// behaviour kubeslot relies on works in it, that a disk survives a power cut, and that it leaves nothing behind.
// They skip (with the reason) where sdhost.Available says the rig cannot run.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/integration/leakcheck"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/integration/sdhost"
	"github.com/kubeslot/kubeslot/lib/exitcode"
)

// unquote strips the quotes of a GVariant text string ("'running'" or "\"running\"").
func unquote(s string) string { return strings.Trim(s, `"'`) }

func TestHostIsIsolatedSystemd(t *testing.T) {
	name := rig.HostName("iso")
	h := rig.StartHost(t, sdhost.Options{Name: name})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := rig.Systemd(t, ctx, h)

	// Which systemd answered: ours runs with container=kubeslot-rig, which systemd reports as container-other.
	virt, err := c.GetManagerProperty("Virtualization")
	if err != nil {
		t.Fatal(err)
	}
	if unquote(virt) != "container-other" {
		t.Errorf("Virtualization = %s, want container-other", virt)
	}
	state, err := c.GetManagerProperty("SystemState")
	if err != nil || (unquote(state) != "running" && unquote(state) != "degraded") {
		t.Errorf("SystemState = %s (%v)", state, err)
	}
	if failed, _ := c.ListUnitsFilteredContext(ctx, []string{"failed"}); len(failed) > 0 {
		t.Errorf("failed units in a fresh host: %v", failed)
	}

	// The machine's enabled units are whited out: none of them runs inside.
	wants, _ := filepath.Glob("/etc/systemd/system/*.wants/*")
	if len(wants) == 0 {
		t.Log("the machine enables no units: whiteout check is vacuous here")
	}
	for _, w := range wants {
		unit := filepath.Base(w)
		p, err := c.GetUnitPropertyContext(ctx, unit, "ActiveState")
		if err != nil {
			t.Errorf("ActiveState of %s: %v", unit, err)
			continue
		}
		if s := unquote(p.Value.String()); s == "active" || s == "activating" {
			t.Errorf("%s (enabled on the machine) is %s inside the host", unit, s)
		}
	}
	if _, err := os.Lstat(h.Root() + "/etc/systemd/system/multi-user.target.wants"); err == nil {
		t.Errorf("the host sees /etc/systemd/system/multi-user.target.wants: not whited out")
	}

	// Identity, network, cgroup.
	out, err := h.Run(ctx, "hostname")
	if err != nil || strings.TrimSpace(string(out)) != name {
		t.Errorf("hostname inside = %q (%v), want %s", out, err, name)
	}
	mine, _ := os.ReadFile("/etc/machine-id")
	theirs, err := h.ReadFile("/etc/machine-id")
	if err != nil || len(strings.TrimSpace(string(theirs))) != 32 || string(theirs) == string(mine) {
		t.Errorf("host machine-id %q (%v), machine's %q: want a fresh one", theirs, err, mine)
	}
	netns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", h.PID()))
	myNetns, _ := os.Readlink("/proc/self/ns/net")
	if netns == myNetns {
		t.Errorf("host shares the machine's network namespace %s without SharedNetwork", netns)
	}
	links, err := os.ReadDir(h.Root() + "/sys/class/net")
	if err != nil || len(links) != 1 || links[0].Name() != "lo" {
		t.Errorf("network devices inside: %v (%v), want just lo", links, err)
	}
	cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", h.PID()))
	if !strings.Contains(string(cg), "/kubeslot-rig/"+name+"/") {
		t.Errorf("PID 1 cgroups (machine view) %q: not under kubeslot-rig/%s", cg, name)
	}
	out, err = h.Run(ctx, "sh", "-c", "echo x > /dev/null && head -c 4 /dev/urandom | wc -c")
	if strings.TrimSpace(string(out)) != "4" {
		t.Errorf("device nodes inside: %q (%v)", out, err)
	}
	out, err = h.Run(ctx, "systemctl", "is-system-running")
	if s := strings.TrimSpace(string(out)); s != "running" && s != "degraded" {
		t.Errorf("systemctl is-system-running inside = %q (%v)", s, err)
	}
}

// TestHostUnits checks the unit behaviour kubeslot's chain relies on, in one host.
func TestHostUnits(t *testing.T) {
	h := rig.StartHost(t, sdhost.Options{Name: rig.HostName("units")})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := rig.Systemd(t, ctx, h)
	install := func(t *testing.T, units ...string) { // name, text, name, text, ...
		t.Helper()
		m := map[string][]byte{}
		for i := 0; i+1 < len(units); i += 2 {
			m[units[i]] = []byte(units[i+1])
		}
		t0 := time.Now()
		if err := h.InstallUnits(ctx, m); err != nil {
			t.Fatal(err)
		}
		rig.Timing(t, fmt.Sprintf("install %d units + daemon-reload", len(m)), time.Since(t0))
	}
	start := func(t *testing.T, unit string) {
		t.Helper()
		ch := make(chan string, 1)
		if _, err := c.StartUnitContext(ctx, unit, "replace", ch); err != nil {
			t.Fatalf("start %s: %v", unit, err)
		}
		if r := <-ch; r != "done" {
			t.Fatalf("start %s: job %s", unit, r)
		}
	}

	t.Run("PathUnitConsumesTrigger", func(t *testing.T) {
		install(t, "kubeslot-test.service", `[Unit]
Description=consumes /srv/req (renames it away: a PathExists trigger left in place re-fires until the start limit)
[Service]
Type=oneshot
ExecStart=/bin/sh -c 'mv /srv/req /srv/req.taken && echo "took $(cat /srv/req.taken)" > /srv/marker'
`, "kubeslot-test.path", "[Path]\nPathExists=/srv/req\n")
		start(t, "kubeslot-test.path")
		t0 := time.Now()
		if err := h.WriteFile("/srv/req", []byte("request-1"), 0o644); err != nil {
			t.Fatal(err)
		}
		rig.Eventually(t, 20*time.Second, "marker from the path-triggered service", func() (bool, string) {
			data, err := h.ReadFile("/srv/marker")
			return err == nil && strings.TrimSpace(string(data)) == "took request-1", fmt.Sprint(string(data), err)
		})
		rig.Timing(t, "path unit fired (trigger -> marker)", time.Since(t0))
		if _, err := h.ReadFile("/srv/req"); err == nil {
			t.Error("trigger /srv/req still there")
		}
		p, err := c.GetUnitPropertyContext(ctx, "kubeslot-test.path", "ActiveState")
		if err != nil || unquote(p.Value.String()) != "active" {
			t.Errorf("kubeslot-test.path ActiveState %v (%v): want active (still watching)", p, err)
		}
	})

	t.Run("DeferredExitIsNotAFailure", func(t *testing.T) {
		unit := func(code int) string {
			return fmt.Sprintf(`[Unit]
StartLimitIntervalSec=0
[Service]
Type=simple
Restart=always
RestartSec=200ms
SuccessExitStatus=%[1]d
RestartPreventExitStatus=%[1]d
ExecStart=/bin/sh -c 'echo run >> /srv/exit%[2]d.count; echo "exiting %[2]d"; exit %[2]d'
`, exitcode.Deferred, code)
		}
		// Inactive units nobody references are garbage-collected, and their last run's properties with them:
		// kubeslot-pin.target references both.
		install(t, "kubeslot-deferred.service", unit(exitcode.Deferred), "kubeslot-failing.service", unit(exitcode.Failure),
			"kubeslot-pin.target", "[Unit]\nAfter=kubeslot-deferred.service kubeslot-failing.service\n")
		start(t, "kubeslot-pin.target")
		start(t, "kubeslot-deferred.service")
		start(t, "kubeslot-failing.service")
		svc := func(unit string) map[string]any {
			p, err := c.GetUnitTypePropertiesContext(ctx, unit, "Service")
			if err != nil {
				t.Fatal(err)
			}
			return p
		}
		// The control is restarted: once it has been, RestartSec has passed several times for the deferred unit too.
		d := rig.Eventually(t, 30*time.Second, "exit 1 under Restart=always restarted", func() (bool, string) {
			n := svc("kubeslot-failing.service")["NRestarts"]
			return n.(uint32) >= 2, fmt.Sprint("NRestarts=", n)
		})
		rig.Timing(t, "exit-1 control restarted twice", d)
		if _, err := h.Run(ctx, "systemctl", "stop", "kubeslot-failing.service"); err != nil {
			t.Error(err)
		}
		p := svc("kubeslot-deferred.service")
		u, err := c.GetUnitPropertiesContext(ctx, "kubeslot-deferred.service")
		if err != nil {
			t.Fatal(err)
		}
		got := fmt.Sprintf("ActiveState=%v Result=%v NRestarts=%v ExecMainStatus=%v", u["ActiveState"], p["Result"], p["NRestarts"], p["ExecMainStatus"])
		want := fmt.Sprintf("ActiveState=inactive Result=success NRestarts=0 ExecMainStatus=%d", exitcode.Deferred)
		if got != want {
			t.Errorf("exit %d under Restart=always: %s, want %s", exitcode.Deferred, got, want)
		}
		runs, _ := h.ReadFile(fmt.Sprintf("/srv/exit%d.count", exitcode.Deferred))
		if n := strings.Count(string(runs), "run"); n != 1 {
			t.Errorf("deferred unit ran %d times, want 1", n)
		}
		out, _ := h.Run(ctx, "systemctl", "is-failed", "kubeslot-deferred.service")
		if s := strings.TrimSpace(string(out)); s != "inactive" {
			t.Errorf("systemctl is-failed kubeslot-deferred.service = %q, want inactive", s)
		}
	})

	t.Run("Journal", func(t *testing.T) {
		word := fmt.Sprintf("kubeslot-journal-%d", time.Now().UnixNano())
		install(t, "kubeslot-echo.service", "[Service]\nType=oneshot\nExecStart=/bin/echo "+word+"\n")
		t0 := time.Now()
		start(t, "kubeslot-echo.service")
		rig.Eventually(t, 20*time.Second, "service stdout in the journal", func() (bool, string) {
			j, err := h.Journal(ctx, "kubeslot-echo.service")
			return err == nil && strings.Contains(j, word), fmt.Sprint(j, err)
		})
		rig.Timing(t, "start oneshot -> stdout in journal", time.Since(t0))
		j, _ := h.Journal(ctx, "kubeslot-deferred.service")
		if !strings.Contains(j, fmt.Sprintf("exiting %d", exitcode.Deferred)) {
			t.Errorf("journal of kubeslot-deferred.service lacks its output:\n%s", j)
		}
	})
}

// TestHostDiskSurvivesPowerLoss runs two hosts at once: a Persistent one keeps its disk through Kill+Boot and
// PowerOff+Boot, the other comes back fresh.
func TestHostDiskSurvivesPowerLoss(t *testing.T) {
	rig.NeedRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var disk, fresh *sdhost.Host
	var errDisk, errFresh error
	var wg sync.WaitGroup
	t0 := time.Now()
	wg.Go(func() { disk, errDisk = rig.BootHost(t, sdhost.Options{Name: rig.HostName("disk"), Persistent: true}) })
	wg.Go(func() { fresh, errFresh = rig.BootHost(t, sdhost.Options{Name: rig.HostName("fresh")}) })
	wg.Wait()
	if errDisk != nil || errFresh != nil {
		t.Fatal(errors.Join(errDisk, errFresh))
	}
	rig.Timing(t, "two hosts booted in parallel", time.Since(t0))
	if disk.PID() == fresh.PID() {
		t.Fatalf("two hosts, one PID %d", disk.PID())
	}

	const file = "/var/lib/kubeslot-test/disk.txt"
	for _, h := range []*sdhost.Host{disk, fresh} {
		if err := h.WriteFile(file, []byte("kept"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// An enabled unit must start again on the next boot; it leaves a marker in /run, which every boot starts empty.
	if err := disk.InstallUnit(ctx, "kubeslot-boot.service", []byte(
		"[Service]\nType=oneshot\nExecStart=/bin/sh -c 'echo kubeslot-boot-ran; touch /run/kubeslot-boot'\n[Install]\nWantedBy=multi-user.target\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := disk.Run(ctx, "systemctl", "enable", "--now", "kubeslot-boot.service"); err != nil {
		t.Fatal(err)
	}
	journalRuns := func(h *sdhost.Host) int {
		j, _ := h.Journal(ctx, "kubeslot-boot.service")
		return strings.Count(j, "kubeslot-boot-ran")
	}
	rig.Eventually(t, 20*time.Second, "first run in the journal", func() (bool, string) { return journalRuns(disk) >= 1, "" })
	idBefore, _ := disk.ReadFile("/etc/machine-id")
	freshID, _ := fresh.ReadFile("/etc/machine-id")

	for _, h := range []*sdhost.Host{disk, fresh} {
		t0 := time.Now()
		if err := h.Kill(); err != nil {
			t.Fatal(err)
		}
		rig.Timing(t, "kill (power cut)", time.Since(t0))
		if h.Running() {
			t.Fatal("host still running after Kill")
		}
		t0 = time.Now()
		if err := h.Boot(ctx); err != nil {
			t.Fatal(err)
		}
		rig.Timing(t, "boot after kill", time.Since(t0))
	}
	if data, err := disk.ReadFile(file); err != nil || string(data) != "kept" {
		t.Errorf("persistent disk after Kill+Boot: %s = %q (%v), want kept", file, data, err)
	}
	if id, _ := disk.ReadFile("/etc/machine-id"); string(id) != string(idBefore) {
		t.Errorf("persistent host's machine-id changed across reboot: %q -> %q", idBefore, id)
	}
	if _, err := disk.ReadFile("/run/kubeslot-boot"); err != nil {
		t.Errorf("enabled unit did not run at the boot after the power cut: %v", err)
	}
	// The journal is on the disk too: the run before the power cut and the one at boot.
	rig.Eventually(t, 20*time.Second, "both boots' runs in the persistent journal", func() (bool, string) {
		n := journalRuns(disk)
		return n >= 2, fmt.Sprint(n, " runs")
	})
	if _, err := fresh.ReadFile(file); err == nil {
		t.Errorf("non-persistent host kept %s across Kill+Boot", file)
	}
	if id, _ := fresh.ReadFile("/etc/machine-id"); string(id) == string(freshID) {
		t.Errorf("non-persistent host kept its machine-id %q across Kill+Boot: not a fresh disk", id)
	}

	// A clean poweroff keeps the disk as well.
	t0 = time.Now()
	if err := disk.PowerOff(ctx); err != nil {
		t.Fatal(err)
	}
	rig.Timing(t, "clean poweroff", time.Since(t0))
	if err := disk.Boot(ctx); err != nil {
		t.Fatal(err)
	}
	if data, err := disk.ReadFile(file); err != nil || string(data) != "kept" {
		t.Errorf("persistent disk after PowerOff+Boot: %q (%v)", data, err)
	}
	c := rig.Systemd(t, ctx, disk)
	if s, err := c.GetManagerProperty("SystemState"); err != nil || unquote(s) != "running" {
		t.Errorf("SystemState after the third boot: %s (%v)", s, err)
	}
}

// TestHostLeavesNothingBehind boots the most machine-touching variant (shared network, persistent disk mounted on
// the machine, hybrid cgroups, a bind mount) and compares machine snapshots before Start and after Stop.
func TestHostLeavesNothingBehind(t *testing.T) {
	rig.NeedRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	release, err := leakcheck.Exclusive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	t0 := time.Now()
	before, err := leakcheck.Take()
	if err != nil {
		t.Fatal(err)
	}
	rig.Timing(t, "leakcheck.Take", time.Since(t0))

	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "hello"), []byte("from the machine"), 0o644); err != nil {
		t.Fatal(err)
	}
	name := rig.HostName("leak")
	mode := "hybrid"
	if _, err := os.Stat("/sys/fs/cgroup/systemd"); err != nil {
		mode = "unified" // pure cgroup2 machine
	}
	o := sdhost.Options{Name: name, SharedNetwork: true, Persistent: true, CgroupMode: mode, Log: rig.HostLog(t),
		Binds: []sdhost.Bind{{Source: src, Target: "/srv/bound", ReadOnly: true}}}
	t0 = time.Now()
	h, err := sdhost.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	rig.Timing(t, "host boot ("+name+", shared net, persistent, "+mode+")", time.Since(t0))
	t.Cleanup(func() { _ = h.Stop(context.Background()) }) // idempotent; only matters when the test fails early

	if data, err := h.ReadFile("/srv/bound/hello"); err != nil || string(data) != "from the machine" {
		t.Errorf("bind mount inside: %q (%v)", data, err)
	}
	if _, err := h.Run(ctx, "sh", "-c", "echo x > /srv/bound/written"); err == nil {
		t.Error("wrote through a read-only bind")
	}
	netns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", h.PID()))
	myNetns, _ := os.Readlink("/proc/self/ns/net")
	if netns != myNetns {
		t.Errorf("SharedNetwork host is in %s, the machine in %s", netns, myNetns)
	}

	// The check sees a running host: its cgroup dir, its disk mount and its systemd.
	mid, err := leakcheck.Take()
	if err != nil {
		t.Fatal(err)
	}
	during := strings.Join(leakcheck.Diff(before, mid), "\n")
	t.Logf("snapshot diff while the host runs:\n%s", during)
	for _, want := range []string{"cgroup dir added (1): /sys/fs/cgroup/unified/kubeslot-rig/" + name,
		"mount added (1): " + filepath.Join(o.StateDir, name, "disk"), "process added (1): systemd: /lib/systemd/systemd --system"} {
		if o.StateDir == "" && strings.HasPrefix(want, "mount") {
			want = "mount added (1): " + filepath.Join(os.TempDir(), "kubeslot-rig", name, "disk")
		}
		if mode == "unified" {
			want = strings.Replace(want, "/sys/fs/cgroup/unified/", "/sys/fs/cgroup/", 1)
		}
		if !strings.Contains(during, want) {
			t.Errorf("snapshot diff while the host runs lacks %q; diff:\n%s", want, during)
		}
	}

	t0 = time.Now()
	if err := h.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	rig.Timing(t, "host stop ("+name+")", time.Since(t0))
	if err := h.Stop(ctx); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	// Anything of this host must be gone at once; unrelated activity on the machine gets a few seconds to settle.
	after, err := leakcheck.Take()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leakcheck.Diff(before, after) {
		if strings.Contains(l, name) || strings.Contains(l, "kubeslot-rig") || strings.Contains(l, "/lib/systemd/systemd") {
			t.Errorf("left behind by the host: %s", l)
		}
	}
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	defer ccancel()
	diff, err := leakcheck.Check(cctx, before)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range diff {
		t.Errorf("machine changed: %s", l)
	}
}
