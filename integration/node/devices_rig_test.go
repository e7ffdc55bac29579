package node

// Devices per node ([node.devices] / spec.node.devices) for real: an isolated host, the nspawn
// backend driven inside it as in TestNspawnBackendOnRig (runNspawnDriver), and fake device nodes made in the HOST's
// own /dev (a tmpfs of its private mount namespace; the machine's /dev is never touched):
//
//   - a listed device node is bound into the node machine and opens there, from a process in the machine's own
//     cgroup (systemd-run inside the node), so the drop-in's DeviceAllow= is what lets it through;
//   - a device node not listed, made in the node's /dev from outside its cgroup (nsenter), opens from there but is
//     refused from inside the node's cgroup ("Operation not permitted"): the device policy holds, and the listed
//     device opens because of its DeviceAllow= line;
//   - a listed device the host lacks, and gpus = "nvidia" on a host without NVIDIA device nodes, fail configure with
//     the documented errors before anything of the slot's host side is written;
//   - the host's memory without an exact [node.devices] allowed entry fails the configuration check, and a block
//     device a wildcard of allowed matches fails configure, each naming the path and the rule;
//   - gpus = "nvidia" over fake NVIDIA nodes and fake driver libraries: the nodes are bound and open, the libraries
//     are there read-only. (No real GPU, driver or device plugin runs on the rig: see README "Devices".)
//
// The fake nodes have the numbers of /dev/kmsg (1:11), which systemd-nspawn@.service's closed device policy does
// not allow by default (unlike /dev/null's), and are only ever opened for writing with nothing written. The
// unlisted one has the numbers of /dev/fuse (10:229), equally harmless to open.

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/config"
)

// devicesProbe runs in the node, in a transient unit of the node's own systemd (so in the machine's cgroup, under
// its device policy; a process nsenter'd into the node would keep the driver's cgroup). Each line says one outcome.
const devicesProbe = `
probe() { if (: >> "$1") 2>/dev/null; then echo "OPEN $1 ok"; else echo "OPEN $1 refused: $( (: >> "$1") 2>&1 )"; fi; }
for d in "$@"; do if [ -c "$d" ]; then probe "$d"; else echo "MISSING $d"; fi; done
echo PROBE-DONE
`

func TestDevicesOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	r := rig.NewWith(t, ctx, "dev", rig.Options{Bare: true, Driver: true})
	cp, srv, h, node, admin, token, ports := r.CP, r.Srv, r.H, r.Node, r.Admin, r.Token, r.Ports
	rootfsSum, kubeletSum := r.Sums["rootfs"], r.Sums["kubelet"]
	base := rig.NspawnRigConfig(node, cp.URL(), string(cp.CAPEM()), token, srv.URL("node-rootfs.tar.gz"), rootfsSum,
		srv.URL("kubelet"), kubeletSum)
	// configure writes the host's configuration with devices, checked like any bootstrap configuration. The host's
	// allowed list names the fakes, as a host that lets its Machines select them would.
	const allowed = `allowed = ["/dev/kubeslot-rig*"]`
	configure := func(devices string) {
		t.Helper()
		doc := base + "\n[node.devices]\n" + allowed + "\n" + devices + "\n"
		if _, err := config.Parse("rig config", []byte(doc)); err != nil {
			t.Fatalf("the test's own config is invalid: %v", err)
		}
		if err := h.WriteFile(rig.NspawnConfigPath, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	drive := func(steps ...string) (string, error) {
		args := []string{rig.NspawnDriverPath, rig.NspawnDriverArg, "-config", rig.NspawnConfigPath,
			"-kubelet-port", fmt.Sprint(ports[0]), "-healthz-port", fmt.Sprint(ports[1]),
			"-node-ip", "127.0.0.1", "-read-only-net-sysctl"}
		out, err := h.Run(ctx, append(args, steps...)...)
		t.Logf("driver %v:\n%s", steps, out)
		return string(out), err
	}
	mustDrive := func(steps ...string) {
		t.Helper()
		t0 := time.Now()
		if _, err := drive(steps...); err != nil {
			t.Fatalf("%v: %v\n%s", steps, err, rig.HostDiag(h))
		}
		t.Logf("timing: %v %.2fs", steps, time.Since(t0).Seconds())
	}
	defer func() {
		_, _ = drive("stop=a", "remove=a")
		_ = admin.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{})
	}()
	hostRun := func(args ...string) {
		t.Helper()
		if out, err := h.Run(ctx, args...); err != nil {
			t.Fatalf("host: %v: %v\n%s", args, err, out)
		}
	}
	// The fakes, in the host's /dev only.
	hostRun("mknod", "-m", "0666", "/dev/kubeslot-rig0", "c", "1", "11")
	hostRun("mknod", "-m", "0666", "/dev/kubeslot-rig1", "c", "1", "11")

	// 0. Dangerous nodes: the host's memory named without an exact allowed entry is refused by the configuration
	// check, naming the field, the path and the rule; a block device under a harmless name, matched by a wildcard
	// only, is refused by configure, which stats it (a fake: 7:250, never opened).
	memDoc := base + "\n[node.devices]\n" + allowed + "\npaths = [\"/dev/mem\"]\n"
	if _, err := config.Parse("rig config", []byte(memDoc)); err == nil ||
		!strings.Contains(err.Error(), `node.devices.paths[0] = "/dev/mem": is the host's raw memory`) ||
		!strings.Contains(err.Error(), "node.devices.allowed") {
		t.Errorf("/dev/mem without an exact allowed entry: %v", err)
	}
	configure(`paths = ["/dev/kubeslot-rig0"]`) // the driver reads it to provision
	mustDrive("provision=a")
	var out string
	if mk, err := h.Run(ctx, "mknod", "-m", "0600", "/dev/kubeslot-rigblk", "b", "7", "250"); err != nil {
		// A host whose device policy refuses making block nodes: lib/isolation/nspawn's unit test covers the rule.
		t.Logf("no fake block device on this host (%v: %s): that case is skipped", err, mk)
	} else {
		configure(`paths = ["/dev/kubeslot-rigblk"]`)
		out, err = drive("configure=a")
		if err == nil || !strings.Contains(out, `node.devices.paths[0] "/dev/kubeslot-rigblk": is a block device`) {
			t.Errorf("a block device through a wildcard: configure %v, want the documented error:\n%s", err, out)
		}
	}

	// 1. Requested and missing: configure fails naming the setting and the device; the host side is not written.
	configure(`paths = ["/dev/kubeslot-rig0", "/dev/kubeslot-rig-absent"]`)
	out, err := drive("configure=a")
	if err == nil || !strings.Contains(out, `node.devices.paths[1] "/dev/kubeslot-rig-absent": the host has no such device node`) {
		t.Errorf("a missing device: configure %v, want the documented error:\n%s", err, out)
	}
	configure(`gpus = "nvidia"`)
	out, err = drive("configure=a")
	if err == nil || !strings.Contains(out, `node.devices.gpus "nvidia": the host has no /dev/nvidiactl and no /dev/nvidia0..N`) {
		t.Errorf("NVIDIA without a driver: configure %v, want the documented error:\n%s", err, out)
	}
	if _, err := h.ReadFile("/etc/systemd/nspawn/a.nspawn"); err == nil {
		t.Error("a.nspawn written although configure failed")
	}

	// 2. One device listed: bound, allowed, and it opens in the node's cgroup; the other one is neither there nor
	// can it be made; a device number the node was not given is refused.
	configure(`paths = ["/dev/kubeslot-rig0"]`)
	mustDrive("configure=a")
	settings, _ := h.ReadFile("/etc/systemd/nspawn/a.nspawn")
	dropIn, _ := h.ReadFile("/etc/systemd/system/systemd-nspawn@a.service.d/kubeslot.conf")
	if !strings.Contains(string(settings), "\nBind=/dev/kubeslot-rig0\n") || !strings.Contains(string(dropIn), "\nDeviceAllow=/dev/kubeslot-rig0 rw\n") {
		t.Errorf("host side lacks the device:\n%s\n%s", settings, dropIn)
	}
	mustDrive("start=a")
	probe := func(devs ...string) string {
		t.Helper()
		// The node's systemd may still be starting: systemd-run waits for its private socket, bounded by the loop.
		var out string
		var err error
		for i := 0; i < 30; i++ {
			args := append([]string{"exec=a", "--", "systemd-run", "--wait", "--pipe", "--quiet", "--collect",
				"--property=RuntimeMaxSec=30", "/bin/sh", "-c", devicesProbe, "probe"}, devs...)
			if out, err = drive(args...); err == nil && strings.Contains(out, "PROBE-DONE") {
				return out
			}
			time.Sleep(time.Second)
		}
		t.Fatalf("probe in the node: %v\n%s\n%s", err, out, rig.HostDiag(h))
		return ""
	}
	// nsenter'd, so outside the machine's cgroup: the node's own /dev, not the host's.
	out, err = drive("exec=a", "--", "/bin/sh", "-c",
		"mknod -m 0666 /dev/kubeslot-unlisted c 10 229 && : >> /dev/kubeslot-unlisted && echo outside-cgroup-ok")
	if err != nil || !strings.Contains(out, "outside-cgroup-ok") {
		t.Fatalf("making the unlisted device in the node: %v\n%s", err, out)
	}
	out = probe("/dev/kubeslot-rig0", "/dev/kubeslot-rig1", "/dev/kubeslot-unlisted")
	if !strings.Contains(out, "OPEN /dev/kubeslot-rig0 ok") {
		t.Errorf("the listed device does not open in the node:\n%s", out)
	}
	if !strings.Contains(out, "MISSING /dev/kubeslot-rig1") {
		t.Errorf("a device not listed is in the node:\n%s", out)
	}
	if !strings.Contains(out, "OPEN /dev/kubeslot-unlisted refused: ") || !strings.Contains(out, "Operation not permitted") {
		t.Errorf("a device the node was not given opens in its cgroup (the device policy enforces nothing?):\n%s", out)
	}

	// 3. Fake NVIDIA: nodes with the fakes' numbers, libraries and nvidia-smi as small files, all in the host.
	for _, n := range []string{"nvidia0", "nvidiactl", "nvidia-uvm"} {
		hostRun("mknod", "-m", "0666", "/dev/"+n, "c", "1", "11")
	}
	lib := "/usr/lib/x86_64-linux-gnu"
	for _, f := range []string{lib + "/libnvidia-ml.so.550.54.15", lib + "/libcuda.so.550.54.15", "/usr/bin/nvidia-smi"} {
		if err := h.WriteFile(f, []byte("fake "+filepath.Base(f)+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	hostRun("ln", "-sf", "libcuda.so.550.54.15", lib+"/libcuda.so.1")
	configure(`gpus = "nvidia"`)
	mustDrive("configure=a", "restart=a")
	out = probe("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/kubeslot-rig0")
	for _, n := range []string{"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"} {
		if !strings.Contains(out, "OPEN "+n+" ok") {
			t.Errorf("%s does not open in the node:\n%s", n, out)
		}
	}
	if !strings.Contains(out, "MISSING /dev/kubeslot-rig0") {
		t.Errorf("a device no longer listed is still in the node:\n%s", out)
	}
	out, err = drive("exec=a", "--", "/bin/sh", "-c",
		"cat "+lib+"/libcuda.so.1 /usr/bin/nvidia-smi; echo x >> "+lib+"/libnvidia-ml.so.550.54.15 2>&1 || echo read-only")
	if err != nil || !strings.Contains(out, "fake libcuda.so.550.54.15") || !strings.Contains(out, "fake nvidia-smi") ||
		!strings.Contains(out, "Read-only file system") {
		t.Errorf("NVIDIA driver files in the node (want them there and read-only): %v\n%s", err, out)
	}
	mustDrive("stop=a", "remove=a")
}
