package config

import (
	"path"
	"regexp"
	"slices"
)

// Devices are the host devices passed into the node machine beyond what it
// always gets (/dev/kvm when the host has it). The Machine spec's
// node.devices sets GPUs and Paths; NVIDIADriverDirs is the host's own.
type Devices struct {
	// GPUs is GPUsNone ("" means the same) or GPUsNVIDIA: bind the host's
	// NVIDIA device nodes and driver files into the node. A host without
	// them fails the node's configure with what is missing.
	GPUs string `toml:"gpus" json:"gpus,omitempty"`
	// Paths are further device nodes under /dev (char or block), bound at
	// the same path and allowed read-write, e.g. "/dev/fuse". Each must
	// exist on the host when the node is configured.
	Paths []string `toml:"paths" json:"paths,omitempty"`
	// Allowed are the device paths a Machine spec's node.devices.paths may
	// select from: path.Match patterns ("/dev/ttyUSB*", "/dev/net/tun").
	// A dangerous node (DeviceDanger) passes only when listed here as its
	// exact path, for the spec and for Paths alike. Only the host's own file
	// sets it: a spec never changes it.
	Allowed []string `toml:"allowed" json:"allowed,omitempty"`
	// NVIDIADriverDirs are the host directories searched for the NVIDIA
	// driver's user-space libraries (nil = DefaultNVIDIADriverDirs); set it
	// on a distribution that installs them elsewhere.
	NVIDIADriverDirs []string `toml:"nvidia_driver_dirs" json:"nvidia_driver_dirs,omitempty"`
}

// GPU kinds of Devices.GPUs.
const (
	GPUsNone   = "none"
	GPUsNVIDIA = "nvidia"
)

// GPUKinds lists the accepted values of Devices.GPUs.
var GPUKinds = []string{GPUsNone, GPUsNVIDIA}

// MaxDevicePaths bounds Devices.Paths (and the Machine spec's list): each
// is a Bind= and a DeviceAllow= line; a host with more devices to pass
// wants a device plugin of its own, not this list.
const MaxDevicePaths = 32

// maxAllowed bounds Devices.Allowed, as MaxDevicePaths the list it gates.
const maxAllowed = 64

// maxDriverDirs bounds Devices.NVIDIADriverDirs.
const maxDriverDirs = 16

// DefaultNVIDIADriverDirs are where the distributions' NVIDIA driver
// packages and NVIDIA's own installer put the libraries (Debian and Ubuntu
// multiarch directories, Fedora/RHEL lib64, the installer's /usr/lib).
var DefaultNVIDIADriverDirs = []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"}

// devicePathRE is a device node under /dev: no spaces, quotes or ':' (a
// Bind= line separates source and target with ':').
var devicePathRE = regexp.MustCompile(`^/dev(/[A-Za-z0-9_.+-]+)+$`)

// devicePatternRE is devicePathRE with path.Match's '*', '?' and classes
// ('[', ']', '^'); no '\\' escapes, which no device name needs.
var devicePatternRE = regexp.MustCompile(`^/dev(/[A-Za-z0-9_.+*?^\[\]-]+)+$`)

// NVIDIA reports whether the node asks for the host's NVIDIA GPUs.
func (d Devices) NVIDIA() bool { return d.GPUs == GPUsNVIDIA }

// DriverDirs is NVIDIADriverDirs with the default applied.
func (d Devices) DriverDirs() []string {
	if d.NVIDIADriverDirs == nil {
		return DefaultNVIDIADriverDirs
	}
	return d.NVIDIADriverDirs
}

// CheckDevicePath says what is wrong with p as an entry of Devices.Paths
// ("" when nothing): the Machine watcher and the tests share it.
func CheckDevicePath(p string) string {
	switch {
	case !devicePathRE.MatchString(p) || len(p) > 255:
		return "must be a device node under /dev: at most 255 letters, digits, '/', '_', '.', '+' and '-', e.g. \"/dev/fuse\""
	case path.Clean(p) != p:
		return "must be a clean path (no '.', '..', '//' or trailing '/'): " + path.Clean(p)
	}
	return ""
}

// CheckDevicePattern says what is wrong with p as an entry of
// Devices.Allowed ("" when nothing).
func CheckDevicePattern(p string) string {
	switch {
	case !devicePatternRE.MatchString(p) || len(p) > 255:
		return "must be a device path or path.Match pattern under /dev: at most 255 letters, digits, '/', '_', '.', '+', '-' " +
			"and the wildcards '*', '?', '[...]', e.g. \"/dev/ttyUSB*\""
	case path.Clean(p) != p:
		return "must be a clean path (no '.', '..', '//' or trailing '/'): " + path.Clean(p)
	}
	if _, err := path.Match(p, "/dev"); err != nil {
		return "is not a valid path.Match pattern (an unclosed '['?)"
	}
	return ""
}

func (v *validator) devices(d *Devices) {
	p := []string{"node", "devices"}
	if d.GPUs != "" && !slices.Contains(GPUKinds, d.GPUs) {
		v.fail(append(p, "gpus"), quote(d.GPUs), "must be one of %s", quoteList(GPUKinds))
	}
	if len(d.Paths) > MaxDevicePaths {
		v.fail(append(p, "paths"), "", "lists %d devices; at most %d are allowed", len(d.Paths), MaxDevicePaths)
	}
	for i, dev := range d.Paths {
		ep := elem(append(p, "paths"), i)
		if msg := CheckDevicePath(dev); msg != "" {
			v.fail(ep, quote(dev), "%s", msg)
		} else if slices.Index(d.Paths, dev) < i {
			v.fail(ep, quote(dev), "is listed twice")
		}
	}
	if len(d.Allowed) > maxAllowed {
		v.fail(append(p, "allowed"), "", "lists %d patterns; at most %d are allowed", len(d.Allowed), maxAllowed)
	}
	for i, pat := range d.Allowed {
		ep := elem(append(p, "allowed"), i)
		if msg := CheckDevicePattern(pat); msg != "" {
			v.fail(ep, quote(pat), "%s", msg)
		} else if slices.Index(d.Allowed, pat) < i {
			v.fail(ep, quote(pat), "is listed twice")
		}
	}
	// The host's own paths need no pattern (the file is trusted), but a
	// dangerous one is named twice, so that a slip does not hand a node the
	// host's memory or disks. The form only here: configure stats the node.
	for i, dev := range d.Paths {
		if CheckDevicePath(dev) != "" {
			continue
		}
		if msg := d.Refusal(dev, nil, false); msg != "" {
			v.fail(elem(append(p, "paths"), i), quote(dev), "%s", msg)
		}
	}
	if len(d.NVIDIADriverDirs) > maxDriverDirs {
		v.fail(append(p, "nvidia_driver_dirs"), "", "lists %d directories; at most %d are allowed", len(d.NVIDIADriverDirs), maxDriverDirs)
	}
	for i, dir := range d.NVIDIADriverDirs {
		ep := elem(append(p, "nvidia_driver_dirs"), i)
		v.absPath(ep, dir)
		if slices.Index(d.NVIDIADriverDirs, dir) < i {
			v.fail(ep, quote(dir), "is listed twice")
		}
	}
}
