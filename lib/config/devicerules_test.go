package config

import (
	"io/fs"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeNode is a FileInfo of a device node with the given type and numbers.
type fakeNode struct {
	mode       fs.FileMode
	major, min uint64
}

func (f fakeNode) Name() string       { return "node" }
func (f fakeNode) Size() int64        { return 0 }
func (f fakeNode) Mode() fs.FileMode  { return f.mode }
func (f fakeNode) ModTime() time.Time { return time.Time{} }
func (f fakeNode) IsDir() bool        { return false }
func (f fakeNode) Sys() any {
	return &syscall.Stat_t{Rdev: (f.major&0xfff)<<8 | (f.major&^0xfff)<<32 | f.min&0xff | (f.min&^0xff)<<12}
}

var (
	charNode  = fakeNode{mode: fs.ModeDevice | fs.ModeCharDevice, major: 188, min: 0}
	blockNode = fakeNode{mode: fs.ModeDevice, major: 8, min: 0}
	memAlias  = fakeNode{mode: fs.ModeDevice | fs.ModeCharDevice, major: 1, min: 1}
)

// TestDeviceDanger: the host's memory and ports by name or numbers, block
// devices by type, or by name when the host has no such node, and raw
// disk character devices by name.
func TestDeviceDanger(t *testing.T) {
	for _, c := range []struct {
		p    string
		fi   fs.FileInfo
		want string // "" for harmless, else a part of the reason
	}{
		{"/dev/mem", nil, "raw memory"},
		{"/dev/kmem", charNode, "raw memory"},
		{"/dev/port", nil, "raw memory"},
		{"/dev/char/1-1", memAlias, "char 1:1, as /dev/mem"},
		{"/dev/kubeslot-disk", blockNode, "is a block device"},
		{"/dev/sda", nil, "named like a block device"},
		{"/dev/sdb1", nil, "named like a block device"},
		{"/dev/nvme0n1p2", nil, "named like a block device"},
		{"/dev/vda", nil, "named like a block device"},
		{"/dev/dm-0", nil, "named like a block device"},
		{"/dev/loop7", nil, "named like a block device"},
		{"/dev/mapper/root", nil, "named like a block device"},
		{"/dev/nvme0", charNode, "disks or CPU registers"},
		{"/dev/sg0", charNode, "disks or CPU registers"},
		{"/dev/cpu/0/msr", charNode, "disks or CPU registers"},
		{"/dev/ttyUSB0", charNode, ""},
		{"/dev/ttyUSB0", nil, ""},
		{"/dev/net/tun", charNode, ""},
		{"/dev/fuse", nil, ""},
		{"/dev/loop-control", nil, ""},
	} {
		got := DeviceDanger(c.p, c.fi)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("DeviceDanger(%s, %v) = %q, want %q", c.p, c.fi != nil, got, c.want)
		}
	}
}

// TestRefusal: a spec path must match an allowed pattern; a dangerous one
// passes only when allowed lists it exactly, from the spec or the host.
func TestRefusal(t *testing.T) {
	d := Devices{Allowed: []string{"/dev/ttyUSB*", "/dev/net/tun", "/dev/*", "/dev/sdb"}}
	for _, c := range []struct {
		p        string
		fi       fs.FileInfo
		fromSpec bool
		want     string
	}{
		{"/dev/ttyUSB3", charNode, true, ""},
		{"/dev/net/tun", charNode, true, ""},
		{"/dev/sdb", nil, true, ""},
		{"/dev/sdb", blockNode, false, ""},
		{"/dev/snd/seq", charNode, true, `is matched by no pattern of the host's node.devices.allowed (/dev/ttyUSB*, /dev/net/tun, /dev/*, /dev/sdb)`},
		{"/dev/mem", nil, true, `lists "/dev/mem" itself (a wildcard pattern never passes it)`},
		{"/dev/mem", nil, false, `lists "/dev/mem" itself`},
		{"/dev/sda", nil, true, `named like a block device`},
		{"/dev/weird", blockNode, true, `is a block device`},
		{"/dev/weird", blockNode, false, `is a block device`},
	} {
		got := d.Refusal(c.p, c.fi, c.fromSpec)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("Refusal(%s, spec %v) = %q, want %q", c.p, c.fromSpec, got, c.want)
		}
	}
	if got := (Devices{}).Refusal("/dev/fuse", charNode, true); !strings.Contains(got, "this host lists none") {
		t.Errorf("no allowed list: %q", got)
	}
	if got := (Devices{}).Refusal("/dev/fuse", charNode, false); got != "" {
		t.Errorf("the host's own harmless path needs no allowed entry: %q", got)
	}
}

// TestDevicesAllowed: allowed parses; a bad pattern, a duplicate, and a
// dangerous host path not listed exactly are reported with the file, the
// field and the value.
func TestDevicesAllowed(t *testing.T) {
	cfg := mustParse(t, with(minimal, "node.devices", `allowed = ["/dev/ttyUSB*", "/dev/net/tun", "/dev/sd[bc]", "/dev/mem"]
paths = ["/dev/mem", "/dev/fuse"]`))
	if len(cfg.Node.Devices.Allowed) != 4 {
		t.Errorf("allowed %v", cfg.Node.Devices.Allowed)
	}
	for _, c := range []struct{ line, want, value string }{
		{`allowed = ["/etc/*"]`, `node.devices.allowed[0]`, `"/etc/*"`},
		{`allowed = ["/dev/tty[USB"]`, `node.devices.allowed[0]`, `not a valid path.Match pattern`},
		{`allowed = ["/dev/../*"]`, `node.devices.allowed[0]`, `"/dev/../*"`},
		{`allowed = ["/dev/a\\*"]`, `node.devices.allowed[0]`, `"/dev/a\\*"`},
		{`allowed = ["/dev/fuse", "/dev/fuse"]`, `node.devices.allowed[1]`, `is listed twice`},
		{`paths = ["/dev/mem"]`, `node.devices.paths[0]`, `"/dev/mem": is the host's raw memory`},
		{"paths = [\"/dev/sda\"]\nallowed = [\"/dev/sd*\"]", `node.devices.paths[0]`, `a wildcard pattern never passes it`},
	} {
		errs := parseErrors(t, with(minimal, "node.devices", c.line))
		if len(errs) != 1 || !strings.Contains(errs.Error(), c.want) || !strings.Contains(errs.Error(), c.value) ||
			!strings.Contains(errs.Error(), "test.toml:") {
			t.Errorf("%s: errors %v, want one naming %s and %s with its line", c.line, errs, c.want, c.value)
		}
	}
}
