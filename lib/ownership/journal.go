package ownership

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"syscall"
	"time"

	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// MaxPriorContent bounds the prior content of one replaced file kept in the
// journal. The record is rewritten whole on every entry, so it must stay
// small; a larger file is not ours to replace.
const MaxPriorContent = 64 << 10

// ErrPriorTooLarge is returned (wrapped) when a file that would be replaced
// is larger than MaxPriorContent: the caller must not replace it.
var ErrPriorTooLarge = errors.New("too large to keep for undo")

// Kind says what sort of host change a journal entry is.
type Kind string

// Kinds of host change. All but KindPackage name a host path.
const (
	KindFile           Kind = "file"            // a file created or replaced
	KindDir            Kind = "dir"             // a directory created
	KindSysctlFile     Kind = "sysctl-file"     // a file in /etc/sysctl.d
	KindModuleFile     Kind = "module-file"     // a file in /etc/modules-load.d
	KindSwapOff        Kind = "swap-off"        // a swap device or file turned off
	KindPackage        Kind = "package"         // a distribution package installed
	KindUnit           Kind = "unit"            // a unit file or drop-in
	KindNspawnSettings Kind = "nspawn-settings" // an .nspawn file
	KindMachineRootfs  Kind = "machine-rootfs"  // a slot's node rootfs
	// KindPodNetwork is a CNI network the node creates in the host's network
	// namespace ([node.cni] mode "bridge"): Name is its bridge link; undo
	// removes the link and the CNI plugins' firewall chains.
	KindPodNetwork Kind = "pod-network"
)

// PriorState says what was at a change's target before kubeslot touched it.
type PriorState string

// Prior states.
const (
	PriorAbsent  PriorState = "absent"  // nothing: undo removes what kubeslot made
	PriorFile    PriorState = "file"    // a regular file: Content, Mode, UID, GID restore it
	PriorDir     PriorState = "dir"     // a directory: Mode, UID, GID
	PriorSymlink PriorState = "symlink" // a symbolic link: Value is its target
	PriorPresent PriorState = "present" // swap was on, a package installed: Value details it
)

// allowedPriors maps each kind to the prior states that make sense for it.
func allowedPriors(k Kind) []PriorState {
	switch k {
	case KindFile, KindSysctlFile, KindModuleFile, KindUnit, KindNspawnSettings:
		return []PriorState{PriorAbsent, PriorFile, PriorSymlink}
	case KindDir, KindMachineRootfs:
		return []PriorState{PriorAbsent, PriorDir}
	case KindSwapOff, KindPackage:
		return []PriorState{PriorAbsent, PriorPresent}
	case KindPodNetwork:
		return []PriorState{PriorAbsent}
	}
	return nil
}

// Valid reports whether k is a kind this release knows.
func (k Kind) Valid() bool { return allowedPriors(k) != nil }

// UsesName reports whether entries of kind k name their target with Name
// (a package, a link) rather than Path (a host path).
func (k Kind) UsesName() bool { return k == KindPackage || k == KindPodNetwork }

// Prior is what was at a target before the change: enough for reset to put
// it back.
type Prior struct {
	State   PriorState  `json:"state"`
	Mode    fs.FileMode `json:"mode,omitempty"` // permission bits (file, dir)
	UID     int         `json:"uid,omitempty"`
	GID     int         `json:"gid,omitempty"`
	Content []byte      `json:"content,omitempty"` // file content (base64 in JSON), at most MaxPriorContent
	Value   string      `json:"value,omitempty"`   // link target, package version, swap detail
}

// Change is one journal entry: a host change outside kubeslot's base.
type Change struct {
	Kind  Kind      `json:"kind"`
	Path  string    `json:"path,omitempty"` // host path as the host sees it
	Name  string    `json:"name,omitempty"` // package name (KindPackage)
	Prior Prior     `json:"prior"`
	At    time.Time `json:"at"` // when it was recorded, just before the change
}

// key identifies the target of a change for deduplication.
func (c Change) key() string { return string(c.Kind) + "\x00" + c.Path + "\x00" + c.Name }

func (c Change) target() string {
	if c.Kind.UsesName() {
		return c.Name
	}
	return c.Path
}

var (
	packageNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)
	linkNameRE    = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}$`)
)

// validate checks a stored entry, which must carry its time.
func (c Change) validate() error {
	if err := c.validateTarget(); err != nil {
		return err
	}
	if c.At.IsZero() {
		return fmt.Errorf("%s %s: at must be set", c.Kind, c.target())
	}
	return nil
}

func (c Change) validateTarget() error {
	allowed := allowedPriors(c.Kind)
	if allowed == nil {
		return fmt.Errorf("kind %q: not a known kind of host change", c.Kind)
	}
	if c.Kind.UsesName() {
		if c.Name == "" || c.Path != "" {
			return fmt.Errorf("%s: want name set and path empty (name %q, path %q)", c.Kind, c.Name, c.Path)
		}
		// Reset hands these names to apt-get and ip: one the host would
		// refuse, or take for an option, is refused here already.
		if c.Kind == KindPackage && !packageNameRE.MatchString(c.Name) {
			return fmt.Errorf("%s %q: not a Debian package name", c.Kind, c.Name)
		}
		if c.Kind == KindPodNetwork && !linkNameRE.MatchString(c.Name) {
			return fmt.Errorf("%s %q: not a network link name (1 to 15 characters of letters, digits, '_', '.', '-', not starting with '-')", c.Kind, c.Name)
		}
	} else {
		if c.Name != "" || !path.IsAbs(c.Path) || path.Clean(c.Path) != c.Path || c.Path == "/" {
			return fmt.Errorf("%s: want a clean absolute host path below / and no name (path %q, name %q)", c.Kind, c.Path, c.Name)
		}
	}
	ok := false
	for _, s := range allowed {
		ok = ok || c.Prior.State == s
	}
	if !ok {
		return fmt.Errorf("%s %s: prior state %q: want one of %v", c.Kind, c.target(), c.Prior.State, allowed)
	}
	if len(c.Prior.Content) > 0 && c.Prior.State != PriorFile {
		return fmt.Errorf("%s %s: prior content given for state %q", c.Kind, c.target(), c.Prior.State)
	}
	if len(c.Prior.Content) > MaxPriorContent {
		return fmt.Errorf("%s %s: prior content of %d bytes: %w (limit %d)", c.Kind, c.target(), len(c.Prior.Content), ErrPriorTooLarge, MaxPriorContent)
	}
	if c.Prior.Mode&^fs.ModePerm != 0 {
		return fmt.Errorf("%s %s: prior mode %v: want permission bits only", c.Kind, c.target(), c.Prior.Mode)
	}
	return nil
}

// Record appends c to the journal and persists the record before returning,
// so the caller makes the change only after its undo information is on
// disk: call it first, and do not make the change if it fails. c.At is set
// here.
//
// If the journal already has an entry of the same kind for the same target,
// Record keeps that one and writes nothing: its prior is the true state
// before kubeslot, while a resumed bootstrap would now see kubeslot's own
// earlier change as "prior". The caller must hold the installation lock.
func (r *Record) Record(root *hostroot.Root, c Change) error {
	if err := c.validateTarget(); err != nil {
		return fmt.Errorf("journal host change: %w", err)
	}
	if _, found := r.Lookup(c.Kind, c.target()); found {
		return nil
	}
	c.Prior.Content = bytes.Clone(c.Prior.Content)
	c.At = r.now()
	oldJournal, oldUpdated := r.Journal, r.UpdatedAt
	r.Journal = append(r.Journal, c)
	r.UpdatedAt = c.At
	if err := Save(root, r); err != nil {
		// Keep memory equal to disk: the change was not journalled.
		r.Journal, r.UpdatedAt = oldJournal, oldUpdated
		return fmt.Errorf("journal %s %s before changing it: %w", c.Kind, c.target(), err)
	}
	return nil
}

// Lookup finds the journal entry of kind for target (a host path, or a
// package name for KindPackage).
func (r *Record) Lookup(kind Kind, target string) (Change, bool) {
	for _, c := range r.Journal {
		if c.Kind == kind && c.target() == target {
			return c, true
		}
	}
	return Change{}, false
}

// Changes returns the journal newest first, the order to undo it in. The
// slice is a copy.
func (r *Record) Changes() []Change {
	out := make([]Change, 0, len(r.Journal))
	for i := len(r.Journal) - 1; i >= 0; i-- {
		out = append(out, r.Journal[i])
	}
	return out
}

// CapturePrior reads what is at hostPath now, for a Change's Prior: absent,
// a regular file (content up to MaxPriorContent, else ErrPriorTooLarge), a
// directory or a symbolic link (not followed). Anything else (a device, a
// socket) is refused: kubeslot must not replace it.
func CapturePrior(root *hostroot.Root, hostPath string) (Prior, error) {
	if !path.IsAbs(hostPath) || path.Clean(hostPath) != hostPath || hostPath == "/" {
		return Prior{}, fmt.Errorf("capture prior state of %q: want a clean absolute host path below /", hostPath)
	}
	// Resolve the parent only: the last component must not be followed if
	// it is a link, or the link itself would be lost on undo.
	dir, err := root.Resolve(path.Dir(hostPath))
	if err != nil {
		return Prior{}, err
	}
	local := filepath.Join(dir, path.Base(hostPath))
	fi, err := os.Lstat(local)
	if errors.Is(err, os.ErrNotExist) {
		return Prior{State: PriorAbsent}, nil
	}
	if err != nil {
		return Prior{}, fmt.Errorf("capture prior state of %s: %w", local, err)
	}
	p := Prior{Mode: fi.Mode().Perm()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		p.UID, p.GID = int(st.Uid), int(st.Gid)
	}
	switch {
	case fi.Mode().IsRegular():
		if fi.Size() > MaxPriorContent {
			return Prior{}, fmt.Errorf("%s: %d bytes: %w (limit %d): refusing to replace it", local, fi.Size(), ErrPriorTooLarge, MaxPriorContent)
		}
		f, err := os.Open(local)
		if err != nil {
			return Prior{}, fmt.Errorf("capture prior state of %s: %w", local, err)
		}
		defer f.Close()
		// Bounded read: the file may have grown since Lstat.
		b, err := io.ReadAll(io.LimitReader(f, MaxPriorContent+1))
		if err != nil {
			return Prior{}, fmt.Errorf("capture prior state of %s: %w", local, err)
		}
		if len(b) > MaxPriorContent {
			return Prior{}, fmt.Errorf("%s: more than %d bytes: %w: refusing to replace it", local, MaxPriorContent, ErrPriorTooLarge)
		}
		p.State, p.Content = PriorFile, b
	case fi.IsDir():
		p.State = PriorDir
	case fi.Mode()&fs.ModeSymlink != 0:
		t, err := os.Readlink(local)
		if err != nil {
			return Prior{}, fmt.Errorf("capture prior state of %s: %w", local, err)
		}
		p = Prior{State: PriorSymlink, Value: t, UID: p.UID, GID: p.GID}
	default:
		return Prior{}, fmt.Errorf("%s: a %v, not a file, directory or link: refusing to replace it", local, fi.Mode().Type())
	}
	return p, nil
}
