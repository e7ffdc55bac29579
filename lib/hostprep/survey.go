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
	install []string  // packages to install
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

func surveyHost(ctx context.Context, root *hostroot.Root, sys System, req Requirements) (*survey, error) {
	if root == nil || sys == nil {
		return nil, fmt.Errorf("host preparation: root and system are required")
	}
	if err := req.Validate(); err != nil {
		return nil, fmt.Errorf("host preparation requirements: %w", err)
	}
	s := &survey{want: req}
	add := func(st Step) { s.plan.Steps = append(s.plan.Steps, st) }

	for _, p := range req.Packages {
		ok, err := sys.PackageInstalled(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("package %s: %w", p, err)
		}
		switch {
		case ok:
			add(Step{Kind: ownership.KindPackage, Target: p, Action: "installed"})
		case !req.InstallPackages:
			add(Step{Kind: ownership.KindPackage, Target: p, Action: "install with apt-get", Needed: true,
				Blocked: fmt.Sprintf("not installed, and host.install_packages is false: install %s (apt-get install %s) or set host.install_packages = true", p, p)})
		default:
			add(Step{Kind: ownership.KindPackage, Target: p, Action: "install with apt-get", Needed: true})
			s.install = append(s.install, p)
		}
	}

	// Module states decide both the modules file (loadable modules only)
	// and what to load; their steps follow the file's, in Apply's order.
	var persist []string
	var loadSteps []Step
	for _, m := range req.Modules {
		st, err := sys.Module(m)
		if err != nil {
			return nil, fmt.Errorf("kernel module %s: %w", m, err)
		}
		switch st {
		case ModuleAbsent:
			loadSteps = append(loadSteps, Step{Kind: KindModuleLoad, Target: m, Action: "load with modprobe", Needed: true})
			s.load = append(s.load, m)
			persist = append(persist, m)
		case ModuleLoaded:
			loadSteps = append(loadSteps, Step{Kind: KindModuleLoad, Target: m, Action: st.String()})
			persist = append(persist, m)
		default:
			loadSteps = append(loadSteps, Step{Kind: KindModuleLoad, Target: m, Action: st.String()})
		}
	}
	var fileSteps []Step
	if len(persist) > 0 {
		fw, st, err := s.checkFile(root, ownership.KindModuleFile, ModulesFile, modulesContent(persist))
		if err != nil {
			return nil, err
		}
		s.modFile, fileSteps = fw, append(fileSteps, st)
	} else if len(req.Modules) > 0 {
		fileSteps = append(fileSteps, Step{Kind: ownership.KindModuleFile, Target: ModulesFile, Action: "not needed: every module is built into the kernel"})
	}
	s.sysctls = slices.Sorted(maps.Keys(req.Sysctls))
	var sysFileStep *Step
	if len(s.sysctls) > 0 {
		fw, st, err := s.checkFile(root, ownership.KindSysctlFile, SysctlFile, sysctlContent(s.sysctls, req.Sysctls))
		if err != nil {
			return nil, err
		}
		s.sysFile, sysFileStep = fw, &st
	}
	// Directories first: they come before the files in Apply.
	for _, d := range s.dirs {
		add(Step{Kind: ownership.KindDir, Target: d, Action: "create directory", Needed: true})
	}
	for _, st := range fileSteps {
		add(st)
	}
	for _, st := range loadSteps {
		add(st)
	}
	if sysFileStep != nil {
		add(*sysFileStep)
	}

	for _, k := range s.sysctls {
		want := req.Sysctls[k]
		cur, err := sys.ReadSysctl(k)
		switch {
		case isNotExist(err) && len(s.load) > 0:
			add(Step{Kind: KindSysctlValue, Target: k, Needed: true,
				Action: fmt.Sprintf("set to %s (the key appears once %s is loaded)", want, strings.Join(s.load, ", "))})
		case isNotExist(err):
			add(Step{Kind: KindSysctlValue, Target: k, Needed: true, Action: "set to " + want,
				Blocked: fmt.Sprintf("the kernel has no such key (/proc/sys/%s): a module it needs is missing", strings.ReplaceAll(k, ".", "/"))})
		case err != nil:
			return nil, fmt.Errorf("sysctl %s: %w", k, err)
		case normValue(cur) == normValue(want):
			add(Step{Kind: KindSysctlValue, Target: k, Action: "already " + want})
		default:
			add(Step{Kind: KindSysctlValue, Target: k, Needed: true, Action: fmt.Sprintf("set to %s (now %s)", want, cur)})
		}
	}

	if req.SwapOff {
		swaps, err := sys.ActiveSwaps()
		if err != nil {
			return nil, fmt.Errorf("active swap: %w", err)
		}
		if len(swaps) == 0 {
			add(Step{Kind: ownership.KindSwapOff, Target: "/proc/swaps", Action: "no swap is active"})
		}
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
			add(st)
		}
	}
	return s, nil
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
