// Package hostprep prepares a host for the node kubeslot runs on it: the
// software it needs (systemd-container, for systemd-nspawn and machinectl),
// the kernel modules (overlay, br_netfilter), the sysctls kubelet needs and
// swap turned off. Preflight says what would change and what is missing,
// changing nothing; Apply makes the changes; Undo reverses one of them.
// Imported by the bootstrap stage (prepare host, --preflight), by the
// resetter (Undo) and by the kubeslot CLI (DetectDistro, for status).
//
// The distribution decides what happens to missing software (DetectDistro,
// from os-release and the markers of image-based systems under the host
// root): apt-based and dnf-based hosts get the package installed (when the
// configuration allows it); image-based hosts (Fedora CoreOS, Flatcar, any
// ostree system or read-only /usr) and hosts with no package manager
// kubeslot knows get nothing installed: a missing command blocks the plan,
// which names what is missing and how to provide it there.
//
// Every change outside the host root is journalled in the ownership record
// (ownership.(*Record).Record) before it is made, with what was there
// before, so reset undoes exactly what kubeslot did:
//
//   - KindPackage (name, prior absent): a package kubeslot installed. A
//     package that was already installed is never recorded, so never removed.
//     Dependencies apt pulled in are not recorded and stay on undo.
//   - KindDir (prior absent): /etc/sysctl.d or /etc/modules-load.d when the
//     host had none; undo removes it only if empty.
//   - KindModuleFile: /etc/modules-load.d/kubeslot.conf, listing the
//     loadable (not built-in) modules so they load at boot. Undo restores the
//     prior file or removes ours, and unloads nothing: other users (bridges,
//     container engines) may rely on the module by then, and a module kubeslot
//     loaded is gone at the next reboot anyway.
//   - KindSysctlFile: /etc/sysctl.d/90-kubeslot.conf, applied at once by
//     writing /proc/sys. Runtime values cannot be "unapplied" by removing a
//     file, so Prior.Value holds a JSON object mapping each key kubeslot
//     changed to {"prior": old value, "set": kubeslot's value}; undo writes
//     the old value back only where the key still holds kubeslot's value (a
//     value someone changed since is theirs now).
//   - KindSwapOff (path of the swap area, prior present): Prior.Value is
//     {"type": ..., "priority": n}; undo turns the area on again with that
//     priority, unless it is already on or gone.
//
// Swap listed in /etc/fstab (or a .swap unit) comes back at the next boot:
// hostprep edits no fstab and masks no unit, because both outlive kubeslot
// and are the host's own configuration, while masking would hide the
// host's swap from its administrator with no trace in fstab. The node's
// kubelet sees the host's /proc/swaps, so it must run with failSwapOn=false
// (swap behaviour NoSwap): a reboot that brings swap back then does not stop
// the node, and the next Apply (idempotent and cheap, so a bootstrap re-run
// on boot may call it) turns swap off again.
//
// The caller holds the installation lock around Apply and Undo.
package hostprep

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

// Host paths of the files hostprep writes.
const (
	SysctlFile  = hostroot.SysctlDir + "/90-kubeslot.conf"
	ModulesFile = hostroot.ModulesDir + "/kubeslot.conf"
)

// Step kinds that appear in a Plan but are never journalled: loading a
// module and setting a runtime sysctl are undone through the module and
// sysctl file entries (see the package comment).
const (
	KindModuleLoad  ownership.Kind = "module-load"
	KindSysctlValue ownership.Kind = "sysctl"
	// KindSoftware: software checked by its commands, on a host where
	// kubeslot installs no packages.
	KindSoftware ownership.Kind = "software"
)

// Requirements is what the host must provide.
type Requirements struct {
	Software []Software        // installed as packages where the family allows, else checked by command
	Modules  []string          // kernel modules, loaded in this order
	Sysctls  map[string]string // key (dotted) → value; written and applied in key order
	SwapOff  bool              // turn every active swap area off
	// InstallPackages allows installing missing packages (config
	// host.install_packages) on apt and dnf hosts; without it a missing
	// package blocks Apply. Other hosts never get packages installed.
	InstallPackages bool
}

// DefaultRequirements is what kubelet in an nspawn machine needs from the
// host.
func DefaultRequirements(installPackages bool) Requirements {
	return Requirements{
		Software: []Software{SystemdContainer},
		Modules:  []string{"overlay", "br_netfilter"},
		Sysctls: map[string]string{
			"net.bridge.bridge-nf-call-iptables":  "1",
			"net.bridge.bridge-nf-call-ip6tables": "1",
			"net.ipv4.ip_forward":                 "1",
		},
		SwapOff:         true,
		InstallPackages: installPackages,
	}
}

// Validate checks every name and value, so none can be taken for a tool's
// option or break the files written.
func (r Requirements) Validate() error {
	seen := map[string]bool{}
	for _, sw := range r.Software {
		if err := sw.validate(); err != nil {
			return err
		}
		if seen[sw.Name] {
			return fmt.Errorf("software %q: listed twice", sw.Name)
		}
		seen[sw.Name] = true
	}
	seen = map[string]bool{}
	for _, m := range r.Modules {
		if err := checkModuleName(m); err != nil {
			return err
		}
		if seen[normModule(m)] {
			return fmt.Errorf("module %q: listed twice", m)
		}
		seen[normModule(m)] = true
	}
	for _, k := range slices.Sorted(maps.Keys(r.Sysctls)) {
		if err := checkSysctlValue(k, r.Sysctls[k]); err != nil {
			return err
		}
	}
	return nil
}

// Step is one thing Preflight looked at.
type Step struct {
	Kind   ownership.Kind
	Target string // package, host path, module, sysctl key or swap area
	// Action says what Apply would do when Needed, and what was found
	// otherwise.
	Action  string
	Needed  bool
	Blocked string // non-empty: it cannot be done, and why
}

// Plan lists the steps in the order Apply takes them: packages (or, where
// kubeslot installs none, software checks), directories, module file,
// module loads, sysctl file, sysctl values, swap.
type Plan struct {
	Distro Distro // the host's distribution, which decided the package steps
	Steps  []Step
}

// Changes returns the steps Apply would carry out.
func (p *Plan) Changes() []Step {
	var out []Step
	for _, s := range p.Steps {
		if s.Needed && s.Blocked == "" {
			out = append(out, s)
		}
	}
	return out
}

// Blocked returns the steps that cannot be carried out.
func (p *Plan) Blocked() []Step {
	var out []Step
	for _, s := range p.Steps {
		if s.Blocked != "" {
			out = append(out, s)
		}
	}
	return out
}

// Err is nil when the plan can be carried out, and otherwise names every
// blocked step.
func (p *Plan) Err() error {
	b := p.Blocked()
	if len(b) == 0 {
		return nil
	}
	msgs := make([]string, len(b))
	for i, s := range b {
		msgs[i] = fmt.Sprintf("%s %s: %s", s.Kind, s.Target, s.Blocked)
	}
	// Not a failure to retry and not deferred: nothing will change until an
	// operator changes the host (exitcode.HostUnfit).
	return exitcode.Unfit(fmt.Errorf("host preparation cannot proceed on %s, nothing was changed: %s", p.Distro, strings.Join(msgs, "; ")))
}

// String renders the plan for --preflight, one step a line:
// "change", "ok" or "BLOCKED", the kind, the target and the action.
func (p *Plan) String() string {
	var b strings.Builder
	for _, s := range p.Steps {
		status, text := "ok", s.Action
		switch {
		case s.Blocked != "":
			status, text = "BLOCKED", s.Blocked
		case s.Needed:
			status = "change"
		}
		fmt.Fprintf(&b, "%-7s  %-12s  %s: %s\n", status, s.Kind, s.Target, text)
	}
	return b.String()
}

var (
	packageRe = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)            // Debian policy
	rpmNameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9+._-]*$`)     // no leading "-": an option to dnf
	moduleRe  = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_-]{0,55}$`) // no leading "-": an option to modprobe
	segmentRe = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
)

func checkPackageName(name string) error {
	if !packageRe.MatchString(name) {
		return fmt.Errorf("package %q: not a Debian package name", name)
	}
	return nil
}

func checkRPMName(name string) error {
	if !rpmNameRe.MatchString(name) {
		return fmt.Errorf("package %q: not an RPM package name", name)
	}
	return nil
}

func checkPackageNames(names []string) error {
	seen := map[string]bool{}
	for _, n := range names {
		if err := checkPackageName(n); err != nil {
			return err
		}
		if seen[n] {
			return fmt.Errorf("package %q: listed twice", n)
		}
		seen[n] = true
	}
	return nil
}

func checkModuleName(name string) error {
	if !moduleRe.MatchString(name) {
		return fmt.Errorf("kernel module %q: not a module name", name)
	}
	return nil
}

func checkSysctlKey(key string) error {
	segs := strings.Split(key, ".")
	if len(segs) < 2 {
		return fmt.Errorf("sysctl key %q: want dotted segments like net.ipv4.ip_forward", key)
	}
	for _, s := range segs {
		if !segmentRe.MatchString(s) {
			return fmt.Errorf("sysctl key %q: segment %q: want letters, digits, '_' or '-'", key, s)
		}
	}
	return nil
}

func checkSysctlValue(key, value string) error {
	if err := checkSysctlKey(key); err != nil {
		return err
	}
	if strings.TrimSpace(value) == "" || strings.ContainsFunc(value, func(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f }) {
		return fmt.Errorf("sysctl %s: value %q: want a non-empty value without control characters", key, value)
	}
	return nil
}

func checkSwapPath(p string) error {
	if !path.IsAbs(p) || path.Clean(p) != p || p == "/" {
		return fmt.Errorf("swap area %q: want a clean absolute path", p)
	}
	return nil
}

// normValue compares sysctl values as the kernel prints them: fields
// separated by any blanks.
func normValue(v string) string { return strings.Join(strings.Fields(v), " ") }

func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }
