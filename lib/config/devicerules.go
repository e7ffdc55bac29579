package config

// What a device path may reach on the host. A device node bound into the node is allowed read-write in its
// cgroup, and the node runs as the host's root: a disk or the host's memory passed that way is the host itself.
// So who may name which path is split: the host's [node.devices] allowed is the list, the Machine spec selects
// from it, and a dangerous node passes only when that list names it exactly.

import (
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strings"
	"syscall"
)

// DeviceStat is how the host's device nodes are looked at: the node at the
// host path p, after links, or nil when there is none (or it cannot be
// read). Callers resolve p through their host root; a nil DeviceStat
// judges by names alone.
type DeviceStat func(p string) fs.FileInfo

// rawMemory are the character devices that read and write the host's
// physical memory, kernel memory and I/O ports, by name and by their
// device numbers (major 1), so an alias such as /dev/char/1:1 is caught.
var rawMemory = map[string]uint32{"/dev/mem": 1, "/dev/kmem": 2, "/dev/port": 4}

// blockNameRE are the names of the usual block devices (SCSI/SATA, NVMe,
// virtio, Xen, MMC, device-mapper, loop, MD, NBD disks and partitions):
// judged by name when the host has no such node to stat, so a spec cannot
// name a disk that appears later (a hot-plugged one) through a pattern.
var blockNameRE = regexp.MustCompile(`^/dev/((sd|hd|vd|xvd|nvme|mmcblk|dm-|loop|md|nbd|sr)[^/]*|mapper/.+|disk/.+)$`)

// rawDiskCharRE are character devices that reach disks or the CPUs' model
// registers all the same (NVMe controllers and generic namespaces, SCSI
// generic, block SCSI generic, /dev/cpu/N/msr): dangerous by name whatever
// their type.
var rawDiskCharRE = regexp.MustCompile(`^/dev/(nvme[0-9]+|ng[0-9]+n[0-9]+|sg[0-9]+|bsg/.+|cpu/.+)$`)

// DeviceDanger says why p is a dangerous node to pass ("" when it is not):
// the host's raw memory or ports, or a block device, by fi's type and
// numbers when fi is not nil, else by name.
func DeviceDanger(p string, fi fs.FileInfo) string {
	if _, ok := rawMemory[p]; ok {
		return "is the host's raw memory or I/O port device"
	}
	if rawDiskCharRE.MatchString(p) {
		return "reaches the host's disks or CPU registers directly"
	}
	if fi == nil {
		if blockNameRE.MatchString(p) && p != "/dev/loop-control" {
			return "is named like a block device (a disk or partition)"
		}
		return ""
	}
	m := fi.Mode()
	if m&fs.ModeDevice != 0 && m&fs.ModeCharDevice == 0 {
		return "is a block device (a disk or partition)"
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && m&fs.ModeCharDevice != 0 {
		major, minor := devMajor(uint64(st.Rdev)), devMinor(uint64(st.Rdev))
		for name, n := range rawMemory {
			if major == 1 && minor == n {
				return fmt.Sprintf("is the host's raw memory or I/O port device (char 1:%d, as %s)", n, name)
			}
		}
	}
	return ""
}

// devMajor and devMinor decode Linux's dev_t (glibc's gnu_dev_major/minor).
func devMajor(d uint64) uint32 { return uint32((d>>8)&0xfff) | uint32((d>>32)&^0xfff) }
func devMinor(d uint64) uint32 { return uint32(d&0xff) | uint32((d>>12)&^0xff) }

// Refusal says why d does not pass the device path p into the node (""
// when it does): fi is the host's node (nil: judge by name), fromSpec says
// p comes from a Machine spec, which may only select what Allowed matches.
// A dangerous node passes only when Allowed lists it exactly: a pattern
// written for serial ports should not hand out a disk that matches it.
func (d Devices) Refusal(p string, fi fs.FileInfo, fromSpec bool) string {
	if why := DeviceDanger(p, fi); why != "" && !slices.Contains(d.Allowed, p) {
		return fmt.Sprintf("%s: it passes only when the host's node.devices.allowed lists %q itself (a wildcard pattern never passes it)", why, p)
	}
	if !fromSpec {
		return ""
	}
	for _, pat := range d.Allowed {
		if ok, err := path.Match(pat, p); err == nil && ok {
			return ""
		}
	}
	if len(d.Allowed) == 0 {
		return "a Machine may only select devices the host's node.devices.allowed lists, and this host lists none"
	}
	return fmt.Sprintf("is matched by no pattern of the host's node.devices.allowed (%s)", strings.Join(d.Allowed, ", "))
}
