package nspawn

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kubeslot/kubeslot/lib/nodeconfig"
)

// mknod makes a char device node with /dev/null's numbers at hostPath in e's
// root (a temp dir: the machine's /dev is never touched). It needs
// CAP_MKNOD; without it the test is skipped.
func (e *env) mknod(hostPath string) { e.mknodAs(hostPath, unix.S_IFCHR, 1, 3) }

// mknodAs makes a device node of type typ (unix.S_IFCHR or S_IFBLK) and
// the given numbers; it is only stat'ed, never opened.
func (e *env) mknodAs(hostPath string, typ uint32, major, minor uint32) {
	e.t.Helper()
	local := filepath.Join(e.root.Prefix(), hostPath)
	if err := os.MkdirAll(filepath.Dir(local), 0o755); err != nil {
		e.t.Fatal(err)
	}
	if err := unix.Mknod(local, typ|0o666, int(unix.Mkdev(major, minor))); err != nil {
		e.t.Skipf("mknod %s: %v (needs CAP_MKNOD)", local, err)
	}
}

func (e *env) devicesBackend(devices string) *Backend {
	return e.backend(e.config(func(doc string) string { return doc + "\n[node.devices]\n" + devices + "\n" }))
}

// TestDevicePaths: a listed device node is bound and allowed read-write; one
// the host lacks (or that is not a device) fails configure naming the key
// and the path, before anything of the slot is written.
func TestDevicePaths(t *testing.T) {
	e := newEnv(t)
	e.mknod("/dev/kubeslot-test0")
	e.put("/dev/not-a-device", []byte("x"))
	b := e.devicesBackend(`paths = ["/dev/kubeslot-test0"]`)
	if err := b.Provision(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if err := b.Configure(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	settings := e.read("/etc/systemd/nspawn/a.nspawn")
	if at := strings.Index(settings, "\nBind=/dev/kubeslot-test0\n"); at < 0 || at > strings.Index(settings, hostBlockMarker) {
		t.Errorf("a.nspawn lacks the device, or has it in the block the pre-start hook replaces:\n%s", settings)
	}
	dropIn := e.read("/etc/systemd/system/systemd-nspawn@a.service.d/kubeslot.conf")
	if !strings.Contains(dropIn, "\nDeviceAllow=/dev/kubeslot-test0 rw\n") {
		t.Errorf("drop-in lacks the device:\n%s", dropIn)
	}

	for _, c := range []struct{ paths, want string }{
		{`["/dev/kubeslot-test0", "/dev/absent"]`, `node.devices.paths[1] "/dev/absent": the host has no such device node`},
		{`["/dev/not-a-device"]`, `node.devices.paths[0] "/dev/not-a-device"`},
	} {
		e2 := newEnv(t)
		e2.mknod("/dev/kubeslot-test0")
		e2.put("/dev/not-a-device", []byte("x"))
		b2 := e2.devicesBackend("paths = " + c.paths)
		if err := b2.Provision(t.Context(), "a"); err != nil {
			t.Fatal(err)
		}
		err := b2.Configure(t.Context(), "a")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("paths %s: %v, want an error with %q", c.paths, err, c.want)
		}
		for _, p := range []string{"/etc/systemd/nspawn/a.nspawn", "/var/lib/machines/a/etc/kubernetes/kubelet-config.yaml"} {
			if e2.exists(p) {
				t.Errorf("paths %s: %s written although configure failed", c.paths, p)
			}
		}
	}
}

// TestDangerousDevicePaths: configure stats each listed node, so a block
// device or the host's memory under a name that does not say so is refused
// naming the path and the rule, unless node.devices.allowed names it
// exactly; a wildcard that matches it is not enough.
func TestDangerousDevicePaths(t *testing.T) {
	for _, c := range []struct{ devices, want string }{
		{`paths = ["/dev/kubeslot-disk"]`, `node.devices.paths[0] "/dev/kubeslot-disk": is a block device`},
		{"paths = [\"/dev/kubeslot-disk\"]\nallowed = [\"/dev/kubeslot-*\"]", `is a block device`},
		{`paths = ["/dev/kubeslot-mem"]`, `node.devices.paths[0] "/dev/kubeslot-mem": is the host's raw memory or I/O port device (char 1:1, as /dev/mem)`},
		{"paths = [\"/dev/kubeslot-disk\"]\nallowed = [\"/dev/kubeslot-disk\"]", ""},
	} {
		e := newEnv(t)
		e.mknodAs("/dev/kubeslot-disk", unix.S_IFBLK, 7, 250)
		e.mknodAs("/dev/kubeslot-mem", unix.S_IFCHR, 1, 1)
		b := e.devicesBackend(c.devices)
		if err := b.Provision(t.Context(), "a"); err != nil {
			t.Fatal(err)
		}
		err := b.Configure(t.Context(), "a")
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.devices, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) ||
			!strings.Contains(err.Error(), "node.devices.allowed")):
			t.Errorf("%s: %v, want an error with %q naming node.devices.allowed", c.devices, err, c.want)
		case c.want != "" && e.exists("/etc/systemd/nspawn/a.nspawn"):
			t.Errorf("%s: a.nspawn written although configure failed", c.devices)
		}
	}
}

// TestNVIDIA: gpus = "nvidia" binds the host's NVIDIA device nodes (allowed
// read-write) and the driver's libraries and tools (read-only); a host
// without the nodes or the libraries fails configure naming what is
// missing; containerd gets the nvidia runtime only when the image has it.
func TestNVIDIA(t *testing.T) {
	e := newEnv(t)
	b := e.devicesBackend(`gpus = "nvidia"`)
	if err := b.Provision(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	err := b.Configure(t.Context(), "a")
	if err == nil || !strings.Contains(err.Error(), `node.devices.gpus "nvidia": the host has no /dev/nvidiactl and no /dev/nvidia0..N`) {
		t.Errorf("no device nodes: %v", err)
	}
	for _, n := range []string{"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidiafake"} {
		e.mknod(n)
	}
	err = b.Configure(t.Context(), "a")
	if err == nil || !strings.Contains(err.Error(), "libnvidia-ml.so.* and libcuda.so.* not found in /usr/lib/x86_64-linux-gnu, ") ||
		!strings.Contains(err.Error(), "node.devices.nvidia_driver_dirs") {
		t.Errorf("no libraries: %v", err)
	}

	lib := "/usr/lib/x86_64-linux-gnu"
	for _, f := range []string{"libnvidia-ml.so.550.54", "libcuda.so.550.54", "libcuda.so", "libnvidia-other.so.1"} {
		e.put(lib+"/"+f, []byte("ELF"))
	}
	e.put("/usr/bin/nvidia-smi", []byte("ELF"))
	for link, target := range map[string]string{"libnvidia-ml.so.1": "libnvidia-ml.so.550.54", "libcuda.so.1": "libcuda.so.550.54"} {
		if err := os.Symlink(target, filepath.Join(e.root.Prefix(), lib, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Configure(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	settings := e.read("/etc/systemd/nspawn/a.nspawn")
	dropIn := e.read("/etc/systemd/system/systemd-nspawn@a.service.d/kubeslot.conf")
	for _, n := range []string{"/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-caps/nvidia-cap1"} {
		if !strings.Contains(settings, "\nBind="+n+"\n") || !strings.Contains(dropIn, "\nDeviceAllow="+n+" rw\n") {
			t.Errorf("%s not bound and allowed:\n%s\n%s", n, settings, dropIn)
		}
	}
	for _, f := range []string{lib + "/libcuda.so.1", lib + "/libcuda.so.550.54", lib + "/libnvidia-ml.so.1", lib + "/libnvidia-ml.so.550.54", "/usr/bin/nvidia-smi"} {
		if !strings.Contains(settings, "\nBindReadOnly="+f+"\n") {
			t.Errorf("%s not bound read-only:\n%s", f, settings)
		}
	}
	for _, not := range []string{"nvidiafake", "libcuda.so\n", "libnvidia-other", "nvidia-debugdump"} {
		if strings.Contains(settings, not) {
			t.Errorf("a.nspawn binds %q:\n%s", not, settings)
		}
	}
	ctd := e.read("/var/lib/machines/a" + nodeconfig.ContainerdConfig)
	if strings.Contains(ctd, "nvidia") {
		t.Errorf("containerd names the nvidia runtime the image lacks:\n%s", ctd)
	}
	e.put("/var/lib/machines/a"+nodeconfig.NVIDIARuntimeBinary, []byte("ELF"))
	if err := b.Configure(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if ctd := e.read("/var/lib/machines/a" + nodeconfig.ContainerdConfig); !strings.Contains(ctd, `default_runtime_name = "nvidia"`) {
		t.Errorf("containerd lacks the nvidia runtime the image has:\n%s", ctd)
	}

	// The driver where the configuration says, not in the default places.
	e2 := newEnv(t)
	for _, n := range []string{"/dev/nvidia0", "/dev/nvidiactl"} {
		e2.mknod(n)
	}
	for _, f := range []string{"libnvidia-ml.so.1", "libcuda.so.1"} {
		e2.put("/opt/nvidia/lib/"+f, []byte("ELF"))
	}
	b2 := e2.devicesBackend("gpus = \"nvidia\"\nnvidia_driver_dirs = [\"/opt/nvidia/lib\"]")
	if err := b2.Provision(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if err := b2.Configure(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if s := e2.read("/etc/systemd/nspawn/a.nspawn"); !strings.Contains(s, "\nBindReadOnly=/opt/nvidia/lib/libcuda.so.1\n") {
		t.Errorf("driver dir of the configuration not used:\n%s", s)
	}
}
