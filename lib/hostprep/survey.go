package hostprep

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

// fileMode is the mode of the files hostprep writes (world-readable, as
// systemd's own files in these directories are).
const fileMode = 0o644

// survey is what Preflight found and Apply acts on. It only reads.
type survey struct {
	plan    Plan
	install []string  // packages to install (apt and dnf hosts only)
	dirs    []string  // host directories to create
	modFile *fileWork // nil: no module needs persisting
	load    []string  // modules to load
	sysFile *fileWork // nil: no sysctls required
	sysctls []string  // keys in order
	want    Requirements
	swaps   []Swap // to turn off
}

// fileWork is one file hostprep owns the content of.
type fileWork struct {
	kind     ownership.Kind
	hostPath string
	content  []byte
	write    bool // absent, or content or mode differ
}

// Preflight reports what Apply would change and what blocks it. It changes
// nothing, on disk or through sys.
func Preflight(ctx context.Context, root *hostroot.Root, sys System, req Requirements) (*Plan, error) {
	s, err := surveyHost(ctx, root, sys, req)
	if err != nil {
		return nil, err
	}
	return &s.plan, nil
}

// surveyHost reads the host, step by step in Apply's order, into the plan
// and the work Apply does. It changes nothing.
func surveyHost(ctx context.Context, root *hostroot.Root, sys System, req Requirements) (*survey, error) {
	if root == nil || sys == nil {
		return nil, fmt.Errorf("host preparation: root and system are required")
	}
	if err := req.Validate(); err != nil {
		return nil, fmt.Errorf("host preparation requirements: %w", err)
	}
	d, err := DetectDistro(root)
	if err != nil {
		return nil, err
	}
	s := &survey{want: req}
	s.plan.Distro = d
	pkgSteps, err := s.packageSteps(ctx, root, sys, req)
	if err != nil {
		return nil, err
	}
	loadSteps, persist, err := s.moduleSteps(sys, req.Modules)
	if err != nil {
		return nil, err
	}
	modFileSteps, err := s.modulesFileSteps(root, req.Modules, persist)
	if err != nil {
		return nil, err
	}
	sysFileSteps, err := s.sysctlFileSteps(root, req.Sysctls)
	if err != nil {
		return nil, err
	}
	valueSteps, err := s.sysctlValueSteps(sys, req.Sysctls)
	if err != nil {
		return nil, err
	}
	var swapSteps []Step
	if req.SwapOff {
		if swapSteps, err = s.swapSteps(sys); err != nil {
			return nil, err
		}
	}
	// The plan lists the steps in Apply's order: packages, the directories
	// the files need, the modules file, the module loads, the sysctl file,
	// the sysctl values, swap.
	for _, steps := range [][]Step{pkgSteps, dirSteps(s.dirs), modFileSteps, loadSteps, sysFileSteps, valueSteps, swapSteps} {
		s.plan.Steps = append(s.plan.Steps, steps...)
	}
	return s, nil
}

// packageSteps checks each required piece of software. On apt and dnf
// hosts it asks the package database, and a missing package is installed
// only when the configuration allows it, otherwise it blocks. Elsewhere
// kubeslot installs nothing and calls no package tool: the software's
// commands must be on the host, and a missing one blocks with how to
// provide it there.
func (s *survey) packageSteps(ctx context.Context, root *hostroot.Root, sys System, req Requirements) ([]Step, error) {
	d := s.plan.Distro
	var steps []Step
	for _, sw := range req.Software {
		if !d.Family.InstallsPackages() {
			st, err := softwareStep(root, d, sw)
			if err != nil {
				return nil, err
			}
			steps = append(steps, st)
			continue
		}
		p, tool := sw.Package(d.Family), installTool(d.Family)
		ok, err := sys.PackageInstalled(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("package %s: %w", p, err)
		}
		switch {
		case ok:
			steps = append(steps, Step{Kind: ownership.KindPackage, Target: p, Action: "installed"})
		case !req.InstallPackages:
			steps = append(steps, Step{Kind: ownership.KindPackage, Target: p, Action: "install with " + tool, Needed: true,
				Blocked: fmt.Sprintf("not installed, and host.install_packages is false: install %s (%s install %s) or set host.install_packages = true", p, tool, p)})
		default:
			steps = append(steps, Step{Kind: ownership.KindPackage, Target: p, Action: "install with " + tool, Needed: true})
			s.install = append(s.install, p)
		}
	}
	return steps, nil
}

// softwareStep checks that every command of sw is on a host where kubeslot
// installs nothing.
func softwareStep(root *hostroot.Root, d Distro, sw Software) (Step, error) {
	var found, missing []string
	for _, c := range sw.Commands {
		p, ok, err := findCommand(root, c)
		if err != nil {
			return Step{}, fmt.Errorf("software %s: %w", sw.Name, err)
		}
		if ok {
			found = append(found, p)
		} else {
			missing = append(missing, c)
		}
	}
	st := Step{Kind: KindSoftware, Target: sw.Name}
	if len(missing) == 0 {
		st.Action = "present (" + strings.Join(found, ", ") + "); nothing installed on this host"
		return st, nil
	}
	st.Needed, st.Action = true, "provide "+strings.Join(missing, ", ")
	st.Blocked = fmt.Sprintf("missing command %s; %s", strings.Join(missing, ", "), howToProvide(d, sw, missing))
	return st, nil
}

// installTool is the command that installs packages on family f.
func installTool(f Family) string {
	if f == FamilyDNF {
		return "dnf"
	}
	return "apt-get"
}

// moduleSteps checks each required kernel module: an absent one is loaded,
// and the loadable ones (absent or loaded, not built in) are returned to be
// persisted in the modules file.
func (s *survey) moduleSteps(sys System, modules []string) (steps []Step, persist []string, err error) {
	for _, m := range modules {
		st, err := sys.Module(m)
		if err != nil {
			return nil, nil, fmt.Errorf("kernel module %s: %w", m, err)
		}
		switch st {
		case ModuleAbsent:
			steps = append(steps, Step{Kind: KindModuleLoad, Target: m, Action: "load with modprobe", Needed: true})
			s.load = append(s.load, m)
			persist = append(persist, m)
		case ModuleLoaded:
			steps = append(steps, Step{Kind: KindModuleLoad, Target: m, Action: st.String()})
			persist = append(persist, m)
		default:
			steps = append(steps, Step{Kind: KindModuleLoad, Target: m, Action: st.String()})
		}
	}
	return steps, persist, nil
}

// modulesFileSteps checks the modules file when any module must be
// persisted, and says it is not needed when every module is built in.
func (s *survey) modulesFileSteps(root *hostroot.Root, modules, persist []string) ([]Step, error) {
	if len(persist) == 0 {
		if len(modules) > 0 {
			return []Step{{Kind: ownership.KindModuleFile, Target: ModulesFile, Action: "not needed: every module is built into the kernel"}}, nil
		}
		return nil, nil
	}
	fw, st, err := s.checkFile(root, ownership.KindModuleFile, ModulesFile, modulesContent(persist))
	if err != nil {
		return nil, err
	}
	s.modFile = fw
	return []Step{st}, nil
}

// sysctlFileSteps checks the sysctl file when any sysctl is required, and
// fixes the order of the keys for it and for the value steps.
func (s *survey) sysctlFileSteps(root *hostroot.Root, sysctls map[string]string) ([]Step, error) {
	s.sysctls = slices.Sorted(maps.Keys(sysctls))
	if len(s.sysctls) == 0 {
		return nil, nil
	}
	fw, st, err := s.checkFile(root, ownership.KindSysctlFile, SysctlFile, sysctlContent(s.sysctls, sysctls))
	if err != nil {
		return nil, err
	}
	s.sysFile = fw
	return []Step{st}, nil
}

// dirSteps creates the missing parent directories checkFile noted: they
// come before the files in Apply.
func dirSteps(dirs []string) []Step {
	var steps []Step
	for _, d := range dirs {
		steps = append(steps, Step{Kind: ownership.KindDir, Target: d, Action: "create directory", Needed: true})
	}
	return steps
}

// sysctlValueSteps compares each required sysctl with the running kernel's
// value; a missing key is fine only when a module to load brings it.
func (s *survey) sysctlValueSteps(sys System, vals map[string]string) ([]Step, error) {
	var steps []Step
	for _, k := range s.sysctls {
		want := vals[k]
		cur, err := sys.ReadSysctl(k)
		switch {
		case isNotExist(err) && len(s.load) > 0:
			steps = append(steps, Step{Kind: KindSysctlValue, Target: k, Needed: true,
				Action: fmt.Sprintf("set to %s (the key appears once %s is loaded)", want, strings.Join(s.load, ", "))})
		case isNotExist(err):
			steps = append(steps, Step{Kind: KindSysctlValue, Target: k, Needed: true, Action: "set to " + want,
				Blocked: fmt.Sprintf("the kernel has no such key (/proc/sys/%s): a module it needs is missing", strings.ReplaceAll(k, ".", "/"))})
		case err != nil:
			return nil, fmt.Errorf("sysctl %s: %w", k, err)
		case normValue(cur) == normValue(want):
			steps = append(steps, Step{Kind: KindSysctlValue, Target: k, Action: "already " + want})
		default:
			steps = append(steps, Step{Kind: KindSysctlValue, Target: k, Needed: true, Action: fmt.Sprintf("set to %s (now %s)", want, cur)})
		}
	}
	return steps, nil
}

// swapSteps turns off each active swap until reboot, unless its path makes
// that unsafe (deleted, or not a plain path): then it blocks.
func (s *survey) swapSteps(sys System) ([]Step, error) {
	swaps, err := sys.ActiveSwaps()
	if err != nil {
		return nil, fmt.Errorf("active swap: %w", err)
	}
	if len(swaps) == 0 {
		return []Step{{Kind: ownership.KindSwapOff, Target: "/proc/swaps", Action: "no swap is active"}}, nil
	}
	var steps []Step
	for _, sw := range swaps {
		st := Step{Kind: ownership.KindSwapOff, Target: sw.Path, Needed: true,
			Action: fmt.Sprintf("turn off (%s, priority %d) until reboot; fstab and swap units are left as they are", sw.Type, sw.Priority)}
		switch {
		case strings.HasSuffix(sw.Path, " (deleted)"):
			st.Blocked = "the swap file was deleted while in use: turn it off by hand (swapoff)"
		case checkSwapPath(sw.Path) != nil:
			st.Blocked = checkSwapPath(sw.Path).Error()
		default:
			s.swaps = append(s.swaps, sw)
		}
		steps = append(steps, st)
	}
	return steps, nil
}

// checkFile compares a file hostprep owns with the content it should have,
// and notes a missing parent directory to create.
func (s *survey) checkFile(root *hostroot.Root, kind ownership.Kind, hostPath string, content []byte) (*fileWork, Step, error) {
	fw := &fileWork{kind: kind, hostPath: hostPath, content: content}
	st := Step{Kind: kind, Target: hostPath}
	dir := path.Dir(hostPath)
	localDir, err := root.Resolve(dir)
	if err != nil {
		return nil, st, err
	}
	fi, err := os.Stat(localDir)
	switch {
	case isNotExist(err):
		if pfi, perr := os.Stat(filepath.Dir(localDir)); perr != nil || !pfi.IsDir() {
			st.Blocked = fmt.Sprintf("neither %s nor its parent directory exists", dir)
			return fw, st, nil
		}
		s.dirs = append(s.dirs, dir)
		fw.write, st.Needed, st.Action = true, true, "write (new file)"
		return fw, st, nil
	case err != nil:
		return nil, st, fmt.Errorf("%s: %w", localDir, err)
	case !fi.IsDir():
		st.Blocked = fmt.Sprintf("%s is not a directory", dir)
		return fw, st, nil
	}
	local := filepath.Join(localDir, path.Base(hostPath))
	fi, err = os.Lstat(local)
	switch {
	case isNotExist(err):
		fw.write, st.Needed, st.Action = true, true, "write (new file)"
		return fw, st, nil
	case err != nil:
		return nil, st, fmt.Errorf("%s: %w", local, err)
	case fi.Mode()&os.ModeSymlink != 0:
		st.Blocked = fmt.Sprintf("%s is a symbolic link: kubeslot writes no file through a link; replace it with a regular file or remove it", local)
		return fw, st, nil
	case !fi.Mode().IsRegular():
		st.Blocked = fmt.Sprintf("%s is a %v, not a regular file", local, fi.Mode().Type())
		return fw, st, nil
	case fi.Size() > ownership.MaxPriorContent:
		st.Blocked = fmt.Sprintf("%s has %d bytes, more than kubeslot keeps for undo (%d): move it away", local, fi.Size(), ownership.MaxPriorContent)
		return fw, st, nil
	}
	old, err := os.ReadFile(local)
	if err != nil {
		return nil, st, fmt.Errorf("%s: %w", local, err)
	}
	switch {
	case !bytes.Equal(old, content):
		fw.write, st.Needed, st.Action = true, true, "replace (content differs; the old content is kept for reset)"
	case fi.Mode().Perm() != fileMode:
		fw.write, st.Needed, st.Action = true, true, fmt.Sprintf("rewrite with mode %04o (now %04o)", fileMode, fi.Mode().Perm())
	default:
		st.Action = "up to date"
	}
	return fw, st, nil
}

const fileHeader = "# Written by kubeslot-bootstrap (host preparation); kubeslot-resetter restores\n# what was here before. Edits are overwritten when kubeslot prepares the host\n# again: put your own settings in another file.\n"

func modulesContent(mods []string) []byte {
	var b strings.Builder
	b.WriteString(fileHeader)
	b.WriteString("# Kernel modules the kubeslot node needs, loaded at boot by systemd-modules-load.\n")
	for _, m := range mods {
		b.WriteString(m + "\n")
	}
	return []byte(b.String())
}

func sysctlContent(keys []string, vals map[string]string) []byte {
	var b strings.Builder
	b.WriteString(fileHeader)
	b.WriteString("# Sysctls kubelet needs. systemd-sysctl applies them at boot, after\n# systemd-modules-load has loaded br_netfilter.\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "%s = %s\n", k, normValue(vals[k]))
	}
	return []byte(b.String())
}
