package config

import (
	"fmt"
	"strings"
	"testing"
)

// TestDevices: [node.devices] parses, changes the fingerprint, and each bad
// value is refused with its key, line and value named.
func TestDevices(t *testing.T) {
	base := mustParse(t, minimal)
	if base.Node.Devices.NVIDIA() || len(base.Node.Devices.DriverDirs()) == 0 {
		t.Errorf("defaults: %+v", base.Node.Devices)
	}
	cfg := mustParse(t, with(minimal, "node.devices", `gpus = "nvidia"
paths = ["/dev/fuse", "/dev/dri/renderD128"]
nvidia_driver_dirs = ["/opt/nvidia/lib"]`))
	d := cfg.Node.Devices
	if !d.NVIDIA() || len(d.Paths) != 2 || d.DriverDirs()[0] != "/opt/nvidia/lib" {
		t.Errorf("parsed %+v", d)
	}
	if cfg.Fingerprint() == base.Fingerprint() {
		t.Error("[node.devices] does not change the fingerprint: a changed device list would not repave")
	}
	if none := mustParse(t, with(minimal, "node.devices", `gpus = "none"`)); none.Node.Devices.NVIDIA() {
		t.Error(`gpus = "none" asks for NVIDIA`)
	}

	many := make([]string, MaxDevicePaths+1)
	for i := range many {
		many[i] = fmt.Sprintf("%q", fmt.Sprintf("/dev/d%d", i))
	}
	for _, c := range []struct{ line, want, value string }{
		{`gpus = "amd"`, `node.devices.gpus`, `"amd"`},
		{`paths = ["/etc/passwd"]`, `node.devices.paths[0]`, `"/etc/passwd"`},
		{`paths = ["dev/fuse"]`, `node.devices.paths[0]`, `"dev/fuse"`},
		{`paths = ["/dev"]`, `node.devices.paths[0]`, `"/dev"`},
		{`paths = ["/dev/../etc/shadow"]`, `node.devices.paths[0]`, `"/dev/../etc/shadow"`},
		{`paths = ["/dev/a:b"]`, `node.devices.paths[0]`, `"/dev/a:b"`},
		{`paths = ["/dev/fuse", "/dev/fuse"]`, `node.devices.paths[1]`, `"/dev/fuse"`},
		{`paths = [` + strings.Join(many, ", ") + `]`, `node.devices.paths`, `at most 32`},
		{`nvidia_driver_dirs = ["lib"]`, `node.devices.nvidia_driver_dirs[0]`, `"lib"`},
	} {
		errs := parseErrors(t, with(minimal, "node.devices", c.line))
		if len(errs) != 1 || !strings.Contains(errs.Error(), c.want) || !strings.Contains(errs.Error(), c.value) ||
			!strings.Contains(errs.Error(), "test.toml:") {
			t.Errorf("%s: errors %v, want one naming %s and %s with its line", c.line, errs, c.want, c.value)
		}
	}
}
