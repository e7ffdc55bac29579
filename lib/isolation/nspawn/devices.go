package nspawn

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
)

// deviceSet is what a node gets of the host's devices by [node.devices]
// (/dev/kvm is configure.go's, passed whenever the host has it): device
// nodes bound at their host path and allowed read-write in the node's
// cgroup, and driver files bound read-only.
type deviceSet struct {
	nodes    []string
	readOnly []string
	nvidia   bool
}

// nvidiaNodeRE are the NVIDIA driver's device nodes under /dev: one per GPU
// (nvidia0..N), the control node, unified memory, its tools node and the
// mode-setting node. MIG capabilities are under /dev/nvidia-caps.
var nvidiaNodeRE = regexp.MustCompile(`^nvidia([0-9]+|ctl|-uvm|-uvm-tools|-modeset)$`)

// nvidiaLibraries are the driver libraries of the NVIDIA container
// toolkit's "utility" and "compute" capabilities (NVML for nvidia-smi and
// the device plugin, CUDA and its JIT compilers, OpenCL); each is bound
// with its versioned files and soname links (lib<name>.so.*).
var nvidiaLibraries = []string{"libnvidia-ml", "libnvidia-cfg", "libcuda", "libcudadebugger", "libnvidia-opencl",
	"libnvidia-ptxjitcompiler", "libnvidia-fatbinaryloader", "libnvidia-allocator", "libnvidia-compiler",
	"libnvidia-nvvm", "libnvidia-gpucomp", "libnvidia-pkcs11"}

// nvidiaRequired must be found for a node with NVIDIA GPUs: without NVML
// neither nvidia-smi nor the device plugin sees a GPU, and without libcuda
// no CUDA program runs.
var nvidiaRequired = []string{"libnvidia-ml", "libcuda"}

// nvidiaBinaries are the driver's tools of the same capabilities, bound
// when the host has them.
var nvidiaBinaries = []string{"/usr/bin/nvidia-smi", "/usr/bin/nvidia-debugdump", "/usr/bin/nvidia-persistenced",
	"/usr/bin/nvidia-cuda-mps-control", "/usr/bin/nvidia-cuda-mps-server"}

// safeName is a file name that can stand in a Bind= line as it is.
var safeName = regexp.MustCompile(`^[A-Za-z0-9_.+-]+$`)

// devices finds on the host what [node.devices] asks for. A device or
// driver the configuration asks for and the host lacks is an error naming
// the setting and what is missing, before anything is written: a node
// silently without its GPUs would only fail its pods later.
func (b *Backend) devices() (deviceSet, error) {
	d := b.cfg.Node.Devices
	var s deviceSet
	for i, p := range d.Paths {
		if !b.hostHas(p, fs.ModeDevice) {
			return s, fmt.Errorf("node.devices.paths[%d] %q: the host has no such device node (char or block): "+
				"load its driver or remove it from the list", i, p)
		}
		// The configuration's form was checked by name; here the node is
		// there to stat, so a block device or the host's memory under an
		// unexpected name is caught before it is bound.
		if msg := d.Refusal(p, b.root.StatFollow(p), false); msg != "" {
			return s, fmt.Errorf("node.devices.paths[%d] %q: %s", i, p, msg)
		}
		if p != kvmDevice { // configure.go's own lines pass it already
			s.nodes = append(s.nodes, p)
		}
	}
	if !d.NVIDIA() {
		return s, nil
	}
	s.nvidia = true
	nodes, err := b.nvidiaNodes()
	if err != nil {
		return s, err
	}
	files, err := b.nvidiaFiles(d.DriverDirs())
	if err != nil {
		return s, err
	}
	for _, n := range nodes {
		if !slices.Contains(s.nodes, n) {
			s.nodes = append(s.nodes, n)
		}
	}
	s.readOnly = files
	return s, nil
}

// nvidiaNodes lists the host's NVIDIA device nodes; the control node and
// one GPU node at least must be there.
func (b *Backend) nvidiaNodes() ([]string, error) {
	var nodes []string
	gpus := 0
	for _, dir := range []string{"/dev", "/dev/nvidia-caps"} {
		names, err := b.readHostDir(dir)
		if err != nil {
			return nil, fmt.Errorf("node.devices.gpus %q: %w", config.GPUsNVIDIA, err)
		}
		for _, n := range names {
			p := path.Join(dir, n)
			if (dir == "/dev" && !nvidiaNodeRE.MatchString(n)) || !safeName.MatchString(n) || !b.hostHas(p, fs.ModeDevice|fs.ModeCharDevice) {
				continue
			}
			nodes = append(nodes, p)
			if strings.TrimLeft(strings.TrimPrefix(n, "nvidia"), "0123456789") == "" && dir == "/dev" {
				gpus++
			}
		}
	}
	var missing []string
	if !slices.Contains(nodes, "/dev/nvidiactl") {
		missing = append(missing, "/dev/nvidiactl")
	}
	if gpus == 0 {
		missing = append(missing, "/dev/nvidia0..N")
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("node.devices.gpus %q: the host has no %s: is the NVIDIA driver loaded? "+
			"(nvidia-smi on the host lists the GPUs; nvidia-modprobe creates the device nodes)",
			config.GPUsNVIDIA, strings.Join(missing, " and no "))
	}
	return nodes, nil
}

// nvidiaFiles lists the driver's libraries in dirs (the first directory
// that has a library wins for it) and the driver's binaries the host has.
func (b *Backend) nvidiaFiles(dirs []string) ([]string, error) {
	var files []string
	found := map[string]bool{}
	for _, dir := range dirs {
		names, err := b.readHostDir(dir)
		if err != nil {
			return nil, fmt.Errorf("node.devices.nvidia_driver_dirs: %w", err)
		}
		inDir := map[string]bool{}
		for _, n := range names {
			lib, _, ok := strings.Cut(n, ".so.")
			if !ok || found[lib] || !slices.Contains(nvidiaLibraries, lib) || !safeName.MatchString(n) {
				continue
			}
			if b.hostRegular(path.Join(dir, n)) { // a soname link resolved to its file
				files = append(files, path.Join(dir, n))
				inDir[lib] = true
			}
		}
		for lib := range inDir {
			found[lib] = true
		}
	}
	var missing []string
	for _, lib := range nvidiaRequired {
		if !found[lib] {
			missing = append(missing, lib+".so.*")
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("node.devices.gpus %q: the NVIDIA driver's %s not found in %s "+
			"(node.devices.nvidia_driver_dirs): install the driver's user-space libraries, or name where they are",
			config.GPUsNVIDIA, strings.Join(missing, " and "), strings.Join(dirs, ", "))
	}
	for _, p := range nvidiaBinaries {
		if b.hostRegular(p) {
			files = append(files, p)
		}
	}
	return files, nil
}

// hostRegular reports whether the host has p as a regular file, after links.
func (b *Backend) hostRegular(p string) bool {
	local, err := b.local(p)
	if err != nil {
		return false
	}
	fi, err := os.Stat(local)
	return err == nil && fi.Mode().IsRegular()
}

// readHostDir lists a host directory's names; a missing one is empty.
func (b *Backend) readHostDir(dir string) ([]string, error) {
	local, err := b.local(dir)
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(local)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return names, nil
}

// settings are the .nspawn [Files] lines of s.
func (s deviceSet) settings() []byte {
	var f strings.Builder
	for _, n := range s.nodes {
		fmt.Fprintf(&f, "Bind=%s\n", n)
	}
	for _, p := range s.readOnly {
		fmt.Fprintf(&f, "BindReadOnly=%s\n", p)
	}
	return []byte(f.String())
}

// dropIn are the unit drop-in's [Service] lines of s: systemd resolves each
// path to its device number when the node starts.
func (s deviceSet) dropIn() []byte {
	var f strings.Builder
	if len(s.nodes) > 0 {
		f.WriteString("# [node.devices]\n")
	}
	for _, n := range s.nodes {
		fmt.Fprintf(&f, "DeviceAllow=%s rw\n", n)
	}
	return []byte(f.String())
}

// nvidiaRuntime is the node path of the NVIDIA container toolkit's runtime
// when s has NVIDIA GPUs and the slot's rootfs has the runtime, else "".
func (s deviceSet) nvidiaRuntime(rootfs string) string {
	if !s.nvidia {
		return ""
	}
	if _, err := os.Lstat(rootfs + nodeconfig.NVIDIARuntimeBinary); err != nil {
		return ""
	}
	return nodeconfig.NVIDIARuntimeBinary
}
