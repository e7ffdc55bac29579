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
