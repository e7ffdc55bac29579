package hostprep

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// System is every side effect host preparation has outside files: packages,
// kernel modules, runtime sysctls and swap. ExecSystem is the real one; tests
// use a recording fake. Methods that run a tool take a context that bounds it.
type System interface {
	// PackageInstalled reports whether a distribution package is installed
	// (dpkg status "install ok installed", or rpm -q), on the package
	// manager of the host's family (DetectDistro): apt or dnf only.
	PackageInstalled(ctx context.Context, name string) (bool, error)
	// InstallPackages installs packages without recommends (weak
	// dependencies), non-interactively.
	InstallPackages(ctx context.Context, names ...string) error
	// RemovePackages removes packages (for undo of what kubeslot installed).
	RemovePackages(ctx context.Context, names ...string) error

	// Module reports whether a kernel module is loaded, built in or absent.
	Module(name string) (ModuleState, error)
	// LoadModule loads a kernel module now (modprobe).
	LoadModule(ctx context.Context, name string) error

	// ReadSysctl reads the runtime value of a sysctl key; an error wrapping
	// fs.ErrNotExist means the key does not exist on this kernel (yet).
	ReadSysctl(key string) (string, error)
	// WriteSysctl sets the runtime value of a sysctl key.
	WriteSysctl(key, value string) error

	// ActiveSwaps lists the swap areas in use (/proc/swaps).
	ActiveSwaps() ([]Swap, error)
	// SwapOff turns one swap area off.
	SwapOff(ctx context.Context, dev string) error
	// SwapOn turns one swap area on; priority < 0 lets the kernel choose.
	SwapOn(ctx context.Context, dev string, priority int) error

	// RemovePodNetwork removes what a CNI bridge network left in the host's
	// network namespace: the bridge link and the CNI plugins' firewall
	// chains (CNI-*) with the rules that jump to them. What is gone already
	// is fine.
	RemovePodNetwork(ctx context.Context, link string) error
}

// ModuleState says how a kernel module is present.
type ModuleState int

// Module states.
const (
	ModuleAbsent  ModuleState = iota // not loaded, not built in: modprobe it
	ModuleLoaded                     // a loadable module, loaded now: persist it for the next boot
	ModuleBuiltin                    // built into the kernel: nothing to load or persist
)

func (s ModuleState) String() string {
	switch s {
	case ModuleAbsent:
		return "not loaded"
	case ModuleLoaded:
		return "loaded"
	case ModuleBuiltin:
		return "built into the kernel"
	}
	return "ModuleState(" + strconv.Itoa(int(s)) + ")"
}

// Swap is one active swap area from /proc/swaps.
type Swap struct {
	Path     string // host path of the device or file
	Type     string // "partition" or "file"
	Priority int    // negative: assigned by the kernel
}

// Default bounds of one tool run when the caller's context has no deadline.
const (
	DefaultCommandTimeout = 2 * time.Minute  // modprobe, swapon, dpkg-query
	DefaultPackageTimeout = 15 * time.Minute // apt-get (downloads)
	DefaultSwapOffTimeout = 15 * time.Minute // swapoff pages everything back in
)

// ExecSystem is the real System: it runs the distribution's tools and reads
// /proc and /sys of the machine this process runs on.
//
// Those tools and kernel files belong to this machine, whatever Root's
// prefix says: with a prefix other than "/" (a test or sandbox root) they
// would change the real machine while the files went under the prefix. So
// every method refuses to run unless Root's prefix is "/" or AllowPrefix is
// set by a caller that knows the prefix stands for this very machine.
type ExecSystem struct {
	Root        *hostroot.Root
	AllowPrefix bool
}

var _ System = ExecSystem{}

func (s ExecSystem) check() error {
	if s.Root == nil {
		return errors.New("hostprep: ExecSystem has no Root")
	}
	if s.Root.Prefix() != "/" && !s.AllowPrefix {
		return fmt.Errorf("hostprep: root prefix is %s, not \"/\": the system tools would act on this machine, not on the prefix; refusing (set ExecSystem.AllowPrefix only if that is intended)", s.Root.Prefix())
	}
	return nil
}

// family detects the host's distribution for the package methods, which
// run only on apt and dnf hosts: elsewhere kubeslot calls no package tool
// (the survey never asks, and this refuses should anything else).
func (s ExecSystem) family() (Family, error) {
	if err := s.check(); err != nil {
		return "", err
	}
	d, err := DetectDistro(s.Root)
	if err != nil {
		return "", err
	}
	if !d.Family.InstallsPackages() {
		return "", fmt.Errorf("hostprep: %s: kubeslot runs no package tool here", d)
	}
	return d.Family, nil
}

// PackageInstalled asks dpkg-query (apt) or rpm (dnf) for the package's
// status.
func (s ExecSystem) PackageInstalled(ctx context.Context, name string) (bool, error) {
	fam, err := s.family()
	if err != nil {
		return false, err
	}
	if fam == FamilyDNF {
		return rpmInstalled(ctx, name)
	}
	if err := checkPackageName(name); err != nil {
		return false, err
	}
	out, err := run(ctx, DefaultCommandTimeout, nil, "dpkg-query", "-W", "-f=${Status}", name)
	if err != nil {
		// Exit 1 with this message: dpkg has never heard of the package.
		if strings.Contains(err.Error(), "no packages found matching") {
			return false, nil
		}
		return false, err
	}
	return strings.TrimSpace(string(out)) == "install ok installed", nil
}

// aptEnv keeps apt and dpkg from asking questions; conffile prompts are
// answered by the --force-conf* options.
var aptEnv = []string{"DEBIAN_FRONTEND=noninteractive", "APT_LISTCHANGES_FRONTEND=none"}

// aptOpts wait a bounded time for a dpkg lock held by, say,
// unattended-upgrades, instead of failing at once.
var aptOpts = []string{"-y", "-q", "-o", "DPkg::Lock::Timeout=120", "-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"}

// InstallPackages runs apt-get install; when apt does not know a package
// (stale or empty package lists, as on a fresh cloud image) it runs
// apt-get update once and tries again.
func (s ExecSystem) InstallPackages(ctx context.Context, names ...string) error {
	fam, err := s.family()
	if err != nil {
		return err
	}
	if fam == FamilyDNF {
		return dnf(ctx, "install", names)
	}
	if err := checkPackageNames(names); err != nil {
		return err
	}
	args := append(append([]string{"install", "--no-install-recommends"}, aptOpts...), names...)
	_, err = run(ctx, DefaultPackageTimeout, aptEnv, "apt-get", args...)
	if err == nil || !(strings.Contains(err.Error(), "Unable to locate package") || strings.Contains(err.Error(), "has no installation candidate")) {
		return err
	}
	if _, uerr := run(ctx, DefaultPackageTimeout, aptEnv, "apt-get", "update", "-q"); uerr != nil {
		return fmt.Errorf("%w; then %w", err, uerr)
	}
	_, err = run(ctx, DefaultPackageTimeout, aptEnv, "apt-get", args...)
	return err
}

// RemovePackages runs apt-get remove (not purge: configuration files an
// administrator may have edited since stay, as dpkg's "config-files" state).
func (s ExecSystem) RemovePackages(ctx context.Context, names ...string) error {
	fam, err := s.family()
	if err != nil {
		return err
	}
	if fam == FamilyDNF {
		return dnf(ctx, "remove", names)
	}
	if err := checkPackageNames(names); err != nil {
		return err
	}
	_, err = run(ctx, DefaultPackageTimeout, aptEnv, "apt-get", append(append([]string{"remove"}, aptOpts...), names...)...)
	return err
}

// rpmInstalled asks rpm whether a package is installed: exit 1 with "is
// not installed" means it is not.
func rpmInstalled(ctx context.Context, name string) (bool, error) {
	if err := checkRPMName(name); err != nil {
		return false, err
	}
	_, err := run(ctx, DefaultCommandTimeout, nil, "rpm", "-q", name)
	if err == nil {
		return true, nil
	}
	if strings.Contains(err.Error(), "is not installed") {
		return false, nil
	}
	return false, err
}

// dnfOpts: no questions, no weak dependencies (apt's --no-install-recommends),
// and on remove only the named packages (what apt-get remove does):
// dependencies dnf pulled in stay, as they do on apt hosts.
var dnfOpts = []string{"-y", "-q", "--setopt=install_weak_deps=False", "--setopt=clean_requirements_on_remove=False"}

// dnf runs dnf install or remove; dnf refreshes its metadata by itself
// when stale, so there is no update step as with apt.
func dnf(ctx context.Context, verb string, names []string) error {
	if len(names) == 0 {
		return nil
	}
	for _, n := range names {
		if err := checkRPMName(n); err != nil {
			return err
		}
	}
	_, err := run(ctx, DefaultPackageTimeout, nil, "dnf", append(append([]string{verb}, dnfOpts...), names...)...)
	return err
}

// moduleEvidence names, for modules kubelet needs, a file that exists only
// when the module's code is in the kernel. A kernel without module support
// (no /proc/modules, no /lib/modules, as in some VMs) lists built-in modules
// nowhere else, and /sys/module/<name> exists only for built-ins that have
// parameters.
var moduleEvidence = map[string]func() bool{
	"overlay": func() bool {
		b, err := os.ReadFile("/proc/filesystems")
		return err == nil && hasField(string(b), "overlay")
	},
	"br_netfilter": func() bool {
		_, err := os.Stat("/proc/sys/net/bridge/bridge-nf-call-iptables")
		return err == nil
	},
}

// Module tells a loaded module (listed in /proc/modules) from a built-in one
// (/sys/module/<name>, modules.builtin, or the evidence above) and an absent
// one. Module names compare with '-' and '_' as equal, as the kernel does.
func (s ExecSystem) Module(name string) (ModuleState, error) {
	if err := s.check(); err != nil {
		return ModuleAbsent, err
	}
	if err := checkModuleName(name); err != nil {
		return ModuleAbsent, err
	}
	norm := normModule(name)
	mods, err := os.ReadFile("/proc/modules")
	switch {
	case err == nil:
		for line := range strings.Lines(string(mods)) {
			if f := strings.Fields(line); len(f) > 0 && normModule(f[0]) == norm {
				return ModuleLoaded, nil
			}
		}
	case !errors.Is(err, fs.ErrNotExist): // absent: a kernel without module support
		return ModuleAbsent, fmt.Errorf("module %s: %w", name, err)
	}
	if _, err := os.Stat(filepath.Join("/sys/module", norm)); err == nil {
		return ModuleBuiltin, nil
	}
	if rel, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		b, err := os.ReadFile(filepath.Join("/lib/modules", strings.TrimSpace(string(rel)), "modules.builtin"))
		if err == nil {
			for line := range strings.Lines(string(b)) {
				base := path.Base(strings.TrimSpace(line))
				if normModule(strings.TrimSuffix(base, ".ko")) == norm {
					return ModuleBuiltin, nil
				}
			}
		}
	}
	if ev := moduleEvidence[norm]; ev != nil && ev() {
		return ModuleBuiltin, nil
	}
	return ModuleAbsent, nil
}

// LoadModule runs modprobe.
func (s ExecSystem) LoadModule(ctx context.Context, name string) error {
	if err := s.check(); err != nil {
		return err
	}
	if err := checkModuleName(name); err != nil {
		return err
	}
	_, err := run(ctx, DefaultCommandTimeout, nil, "modprobe", name)
	return err
}

// ReadSysctl reads /proc/sys directly.
func (s ExecSystem) ReadSysctl(key string) (string, error) {
	if err := s.check(); err != nil {
		return "", err
	}
	p, err := sysctlPath(key)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return "", fmt.Errorf("sysctl %s: %w", key, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// WriteSysctl writes /proc/sys directly, without creating anything: a key
// the kernel does not have is an error, not a new file.
func (s ExecSystem) WriteSysctl(key, value string) error {
	if err := s.check(); err != nil {
		return err
	}
	if err := checkSysctlValue(key, value); err != nil {
		return err
	}
	p, err := sysctlPath(key)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return fmt.Errorf("set sysctl %s = %s: %w", key, value, err)
	}
	if _, err := f.WriteString(value + "\n"); err != nil {
		f.Close()
		return fmt.Errorf("set sysctl %s = %s: %w", key, value, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("set sysctl %s = %s: %w", key, value, err)
	}
	return nil
}

// ActiveSwaps parses /proc/swaps.
func (s ExecSystem) ActiveSwaps() ([]Swap, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	b, err := os.ReadFile("/proc/swaps")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // a kernel without swap support
	}
	if err != nil {
		return nil, fmt.Errorf("read /proc/swaps: %w", err)
	}
	return parseSwaps(string(b))
}

// SwapOff runs swapoff.
func (s ExecSystem) SwapOff(ctx context.Context, dev string) error {
	if err := s.check(); err != nil {
		return err
	}
	if err := checkSwapPath(dev); err != nil {
		return err
	}
	_, err := run(ctx, DefaultSwapOffTimeout, nil, "swapoff", dev)
	return err
}

// SwapOn runs swapon, with the priority the area had when priority >= 0.
func (s ExecSystem) SwapOn(ctx context.Context, dev string, priority int) error {
	if err := s.check(); err != nil {
		return err
	}
	if err := checkSwapPath(dev); err != nil {
		return err
	}
	args := []string{dev}
	if priority >= 0 {
		args = []string{"-p", strconv.Itoa(priority), dev}
	}
	_, err := run(ctx, DefaultCommandTimeout, nil, "swapon", args...)
	return err
}

// parseSwaps reads the /proc/swaps table: a header line, then
// "Filename Type Size Used Priority" with blanks in the file name escaped
// as octal (\040).
func parseSwaps(text string) ([]Swap, error) {
	var out []Swap
	for i, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) == 0 {
			continue // header, trailing newline
		}
		if len(f) < 5 {
			return nil, fmt.Errorf("/proc/swaps line %d %q: want 5 fields", i+1, line)
		}
		prio, err := strconv.Atoi(f[4])
		if err != nil {
			return nil, fmt.Errorf("/proc/swaps line %d: priority %q: %w", i+1, f[4], err)
		}
		out = append(out, Swap{Path: unescapeOctal(f[0]), Type: f[1], Priority: prio})
	}
	return out, nil
}

// unescapeOctal undoes the kernel's \ooo escaping of path names.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func sysctlPath(key string) (string, error) {
	if err := checkSysctlKey(key); err != nil {
		return "", err
	}
	return "/proc/sys/" + strings.ReplaceAll(key, ".", "/"), nil
}

func normModule(name string) string { return strings.ReplaceAll(name, "-", "_") }

func hasField(text, field string) bool {
	for line := range strings.Lines(text) {
		for _, f := range strings.Fields(line) {
			if f == field {
				return true
			}
		}
	}
	return false
}
