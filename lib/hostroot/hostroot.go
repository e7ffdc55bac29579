// Package hostroot is the one place that turns a host path kubeslot touches
// into a path on this machine's filesystem.
//
// Every path resolves under a root prefix ("/" on a real host, a temporary
// directory in tests and sandboxes). Symlinks are followed as if the prefix
// were "/": an absolute link target starts again at the prefix, and any
// ".." that would climb above the prefix is refused with an error, so nothing
// resolved here can name a file outside it.
//
// Host paths (what systemd and unit files see) and local paths (what this
// process opens) are kept apart: HostPath gives the former, the resolving
// methods give the latter. Files kubeslot reads are opened without
// following links and read within a bound (OpenRegular, ReadRegular); its
// state files are StateFile values. Imported by every lib/ package and
// cmd/ binary that touches the host.
package hostroot

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// EnvPrefix names the environment variable that sets the root prefix when no
// flag does.
const EnvPrefix = "KUBESLOT_ROOT_PREFIX"

// Host paths of the places kubeslot uses, as seen from the host's "/".
const (
	DefaultBase = "/opt/kubeslot"       // kubeslot's own tree
	UnitDir     = "/etc/systemd/system" // unit files and drop-ins
	NspawnDir   = "/etc/systemd/nspawn" // .nspawn settings per slot
	MachinesDir = "/var/lib/machines"   // one rootfs per slot
	RunDir      = "/run/kubeslot"       // volatile: the installation lock
	LockName    = "install.lock"        // in RunDir
	SysctlDir   = "/etc/sysctl.d"       // host preparation
	ModulesDir  = "/etc/modules-load.d" // host preparation
)

// Names inside the base (see DESIGN.md, "Host layout").
const (
	LayoutFile    = "layout-version"
	OwnershipFile = "ownership.json"
	AppliedDir    = "applied"
	RequestsDir   = "requests"
	StatusDir     = "status"
	StateDir      = "state"
	CacheDir      = "cache"
	IdentityDir   = "identity"
	// NodeDir holds the node's state kept across slots (containerd's
	// images, a cluster CNI's config and plugins), bound into the node.
	NodeDir      = "node"
	ReleasesDir  = "releases"
	CurrentLink  = "current"
	LastGoodLink = "last-good"
	// ResettingDir holds the resetter's own copy while a reset is under
	// way (lib/reset): it outlives the releases, and goes last.
	ResettingDir = "resetting"
	// ParentsFile lists the directories kubeslot made above the base when
	// it made the base (or moved it there): reset removes them, empty,
	// after the base. Absent when there were none.
	ParentsFile = "parents.json"
)

// maxLinks bounds symlink expansion, like the kernel's ELOOP limit.
const maxLinks = 40

// ErrEscape is returned (wrapped) when a path or a symlink on it would lead
// outside the root prefix.
var ErrEscape = errors.New("leads outside the root prefix")

// Root resolves host paths under one prefix. The zero value is not usable;
// build one with New.
type Root struct {
	prefix string // absolute, symlink-free, cleaned
	base   string // host path of kubeslot's own tree
}

// New returns a Root for prefix (an existing directory, never "": a sandbox
// whose prefix went missing must not act on the host) with kubeslot's tree at
// base (a host path; "" means DefaultBase).
func New(prefix, base string) (*Root, error) {
	if prefix == "" {
		return nil, errors.New("root prefix is empty: give a directory, or / for this host")
	}
	if !filepath.IsAbs(prefix) {
		return nil, fmt.Errorf("root prefix %q: must be an absolute path", prefix)
	}
	// The prefix is used as given, not resolved: /proc/PID/root of a process
	// in another mount namespace reads as "/" through readlink, yet the
	// kernel follows it into that process's root. Resolving it would
	// silently point every path at this machine's own root.
	fi, err := os.Stat(prefix)
	if err != nil {
		return nil, fmt.Errorf("root prefix %q: %w", prefix, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("root prefix %q: not a directory", prefix)
	}
	if base == "" {
		base = DefaultBase
	}
	if !path.IsAbs(base) || path.Clean(base) == "/" {
		return nil, fmt.Errorf("host root %q: must be an absolute path below /", base)
	}
	return &Root{prefix: filepath.Clean(prefix), base: path.Clean(base)}, nil
}

// Prefix is the local directory that stands for the host's "/".
func (r *Root) Prefix() string { return r.prefix }

// Base is the host path of kubeslot's own tree (e.g. /opt/kubeslot).
func (r *Root) Base() string { return r.base }

// HostPath joins elems onto kubeslot's base as the host sees it, for unit
// files and systemd calls. It does not touch the filesystem.
func (r *Root) HostPath(elem ...string) string {
	return path.Join(append([]string{r.base}, elem...)...)
}

// Resolve maps a host path to a local path under the prefix, following
// symlinks as if the prefix were "/". Components that do not exist yet are
// taken as written. A path or link that climbs above the prefix is refused.
func (r *Root) Resolve(hostPath string) (string, error) {
	if !path.IsAbs(hostPath) {
		return "", fmt.Errorf("resolve %q: not an absolute host path", hostPath)
	}
	var (
		done  []string // resolved components, no symlinks among them
		todo  = split(hostPath)
		links int
	)
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(done) == 0 {
				return "", fmt.Errorf("resolve %q: %w", hostPath, ErrEscape)
			}
			done = done[:len(done)-1]
			continue
		}
		local := filepath.Join(r.prefix, filepath.Join(done...), c)
		fi, err := os.Lstat(local)
		switch {
		case errors.Is(err, os.ErrNotExist):
			// Nothing below a missing component can be a link yet.
			done = append(done, c)
			continue
		case err != nil:
			return "", fmt.Errorf("resolve %q: %w", hostPath, err)
		case fi.Mode()&os.ModeSymlink == 0:
			done = append(done, c)
			continue
		}
		if links++; links > maxLinks {
			return "", fmt.Errorf("resolve %q: too many levels of symbolic links", hostPath)
		}
		target, err := os.Readlink(local)
		if err != nil {
			return "", fmt.Errorf("resolve %q: %w", hostPath, err)
		}
		if path.IsAbs(target) {
			done = nil // an absolute link starts again at the prefix
		}
		// A ".." inside the target is checked by the loop like any other, so
		// a link cannot climb out either.
		todo = append(split(target), todo...)
	}
	return filepath.Join(r.prefix, filepath.Join(done...)), nil
}

// Path resolves a path inside kubeslot's base.
func (r *Root) Path(elem ...string) (string, error) { return r.Resolve(r.HostPath(elem...)) }

// File resolves a file inside kubeslot's base with no-follow semantics for
// its last component: the directories on the way are resolved like Path,
// the file's own name is taken literally. Opened with OpenRegular (or
// replaced by lib/atomicfile's rename), a link planted in its place is
// refused or replaced, never followed to what it names, which under the
// prefix "/" could be any file of the host.
func (r *Root) File(elem ...string) (string, error) {
	host := r.HostPath(elem...)
	dir, name := path.Split(host)
	if err := checkName(name); err != nil || host == r.base {
		return "", fmt.Errorf("file %q: must name a file inside %s", host, r.base)
	}
	local, err := r.Resolve(dir)
	if err != nil {
		return "", err
	}
	return filepath.Join(local, name), nil
}

// ErrLink is returned (wrapped) when a unit file, an nspawn settings file or
// a slot rootfs is a symbolic link: kubeslot writes and removes these as
// root, and a link there (under the prefix "/", to any file or tree of the
// host) would have it write or delete through it.
var ErrLink = errors.New("is a symbolic link: kubeslot does not write or remove through a link here")

// Entry resolves hostPath's directory like Resolve and takes its last
// component literally (no-follow); a symbolic link there is refused with an
// error naming the path (ErrLink). Unit, Nspawn and Machine use it.
func (r *Root) Entry(hostPath string) (string, error) {
	if !path.IsAbs(hostPath) {
		return "", fmt.Errorf("resolve %q: not an absolute host path", hostPath)
	}
	dir, name := path.Split(path.Clean(hostPath))
	if err := checkName(name); err != nil {
		return "", fmt.Errorf("%s: %w", hostPath, err)
	}
	local, err := r.Resolve(dir)
	if err != nil {
		return "", fmt.Errorf("%s: %w", hostPath, err)
	}
	local = filepath.Join(local, name)
	if fi, err := os.Lstat(local); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		return "", fmt.Errorf("%s (%s) %w", hostPath, local, ErrLink)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("%s: %w", hostPath, err)
	}
	return local, nil
}

// Unit resolves a unit file (or drop-in directory) in the unit directory,
// refusing a link in its place (Entry).
func (r *Root) Unit(name string) (string, error) { return r.named(UnitDir, name) }

// Nspawn resolves an nspawn settings file, refusing a link in its place
// (Entry).
func (r *Root) Nspawn(name string) (string, error) { return r.named(NspawnDir, name) }

// Machine resolves a path inside a slot's node rootfs. The slot directory
// itself must not be a link (Entry): removing or replacing a slot would
// otherwise act on whatever tree it names. Links inside the rootfs are
// followed like any other.
func (r *Root) Machine(slot string, elem ...string) (string, error) {
	if err := checkName(slot); err != nil {
		return "", fmt.Errorf("slot %q: %w", slot, err)
	}
	rootfs, err := r.Entry(path.Join(MachinesDir, slot))
	if err != nil || len(elem) == 0 {
		return rootfs, err
	}
	return r.Resolve(path.Join(append([]string{MachinesDir, slot}, elem...)...))
}

// Lock resolves the installation lock file, its own name taken literally
// (no-follow, like File): a link in its place is refused when opened.
func (r *Root) Lock() (string, error) {
	local, err := r.Resolve(RunDir)
	if err != nil {
		return "", err
	}
	return filepath.Join(local, LockName), nil
}

func (r *Root) named(dir, name string) (string, error) {
	if err := checkName(name); err != nil {
		return "", fmt.Errorf("%s name %q: %w", dir, name, err)
	}
	return r.Entry(path.Join(dir, name))
}

// checkName accepts a single path component.
func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return errors.New("must be a single, non-empty path component")
	}
	return nil
}

func split(p string) []string { return strings.Split(p, "/") }

// StatFollow is os.Stat of a host path, links followed as Resolve follows
// them (so a link cannot point the caller outside the prefix): nil when
// nothing is there or it cannot be read. For judging a host file by its
// type, as the device checks do, where absent and unreadable mean the same.
func (r *Root) StatFollow(hostPath string) fs.FileInfo {
	local, err := r.Resolve(hostPath)
	if err != nil {
		return nil
	}
	fi, err := os.Stat(local)
	if err != nil {
		return nil
	}
	return fi
}
