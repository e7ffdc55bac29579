package watcher

import (
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// blockInfo is a FileInfo of a block device node.
type blockInfo struct{}

func (blockInfo) Name() string       { return "disk" }
func (blockInfo) Size() int64        { return 0 }
func (blockInfo) Mode() fs.FileMode  { return fs.ModeDevice }
func (blockInfo) ModTime() time.Time { return time.Time{} }
func (blockInfo) IsDir() bool        { return false }
func (blockInfo) Sys() any           { return nil }

// TestSpecDevicesSelectFromAllowed: a spec path must match the host's
// allowed list; a dangerous node (by name, or by what the host's node is)
// needs an exact entry; each refusal names the spec field, the path and the
// rule.
func TestSpecDevicesSelectFromAllowed(t *testing.T) {
	a := applied(t)
	a.Config.Node.Devices.Allowed = []string{"/dev/ttyUSB*", "/dev/*", "/dev/port"}
	m := NewMachine("m1", node, a)
	stat := func(p string) fs.FileInfo {
		if p == "/dev/kubeslot-disk" {
			return blockInfo{}
		}
		return nil
	}
	for _, c := range []struct {
		paths []v1alpha1.DevicePath
		want  string // "" accepted, else parts of the error
	}{
		{[]v1alpha1.DevicePath{"/dev/ttyUSB0", "/dev/fuse"}, ""},
		{[]v1alpha1.DevicePath{"/dev/port"}, ""},
		{[]v1alpha1.DevicePath{"/dev/fuse", "/dev/mem"}, `spec.node.devices.paths[1] = "/dev/mem": is the host's raw memory or I/O port device`},
		{[]v1alpha1.DevicePath{"/dev/kmem"}, `a wildcard pattern never passes it`},
		{[]v1alpha1.DevicePath{"/dev/sda"}, `spec.node.devices.paths[0] = "/dev/sda": is named like a block device`},
		{[]v1alpha1.DevicePath{"/dev/kubeslot-disk"}, `spec.node.devices.paths[0] = "/dev/kubeslot-disk": is a block device`},
		{[]v1alpha1.DevicePath{"/dev/net/tun"}, `spec.node.devices.paths[0] = "/dev/net/tun": is matched by no pattern of the host's node.devices.allowed`},
	} {
		m.Spec.Node.Devices = &v1alpha1.Devices{Paths: c.paths}
		_, err := Desired(a.Config, &m.Spec.Node, stat)
		if c.want == "" && err != nil {
			t.Errorf("%v: %v", c.paths, err)
		}
		if c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%v: %v, want %q", c.paths, err, c.want)
		}
	}
	// Absent from the spec, the host's own paths stand, allowed or not.
	a.Config.Node.Devices.Paths = []string{"/dev/fuse"}
	a.Config.Node.Devices.Allowed = nil
	m.Spec.Node.Devices = nil
	if _, err := Desired(a.Config, &m.Spec.Node, nil); err != nil {
		t.Errorf("the host's own devices: %v", err)
	}
}

// TestDecideRefusesDeviceSpec: a Machine naming /dev/mem on a host whose
// allowed list only has wildcards is reported Degraded/InvalidSpec with the
// field named, and no repave is requested.
func TestDecideRefusesDeviceSpec(t *testing.T) {
	in := base(t)
	in.Applied.Config.Node.Devices.Allowed = []string{"/dev/*"}
	in.Machine.Spec.UpdatePolicy = v1alpha1.UpdateImmediate
	in.NodeExists = false
	in.Machine.Spec.Node.Devices = &v1alpha1.Devices{Paths: []v1alpha1.DevicePath{"/dev/mem"}}
	as := Decide(in)
	if got := strings.Join(summary(as), "; "); got != "report Degraded Degraded/InvalidSpec" {
		t.Fatalf("got %q", got)
	}
	msg := as[len(as)-1].Conditions[0].Message
	if !strings.Contains(msg, `spec.node.devices.paths[0] = "/dev/mem"`) || !strings.Contains(msg, "node.devices.allowed") {
		t.Errorf("Degraded message %q does not name the field, the path and the rule", msg)
	}
	// The same spec on a host that lists /dev/mem itself repaves.
	in.Applied.Config.Node.Devices.Allowed = []string{"/dev/mem"}
	if got := strings.Join(summary(Decide(in)), "; "); !strings.HasPrefix(got, "write repave-") {
		t.Errorf("allowed exactly: got %q, want a repave", got)
	}
}

// TestSpecGPUsNeedTheHost: a spec asking for the host's NVIDIA GPUs is
// refused, naming the field and the rule, unless the host's own
// configuration sets gpus = "nvidia" or allows /dev/nvidiactl.
func TestSpecGPUsNeedTheHost(t *testing.T) {
	for _, c := range []struct {
		gpus    string
		allowed []string
		ok      bool
	}{
		{"", nil, false},
		{"", []string{"/dev/ttyUSB*"}, false},
		{"none", []string{"/dev/nvidia*"}, true},
		{"", []string{"/dev/*"}, true},
		{"nvidia", nil, true},
	} {
		a := applied(t)
		a.Config.Node.Devices.GPUs, a.Config.Node.Devices.Allowed = c.gpus, c.allowed
		m := NewMachine("m1", node, a)
		m.Spec.Node.Devices = &v1alpha1.Devices{GPUs: v1alpha1.GPUsNVIDIA}
		_, err := Desired(a.Config, &m.Spec.Node, nil)
		switch {
		case c.ok && err != nil:
			t.Errorf("host gpus %q, allowed %q: %v", c.gpus, c.allowed, err)
		case !c.ok && (err == nil || !strings.Contains(err.Error(), `spec.node.devices.gpus = "NVIDIA"`) ||
			!strings.Contains(err.Error(), "/dev/nvidiactl")):
			t.Errorf("host gpus %q, allowed %q: %v, want the GPUs refused naming the field and the rule", c.gpus, c.allowed, err)
		}
	}
}
