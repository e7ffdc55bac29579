package hostroot

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
)

// SystemDirs are directories reset never removes, nor takes for a base: a
// mistaken --host-root must not make a reset delete /opt, and an empty
// /srv kubeslot made stays as a host expects it.
var SystemDirs = []string{"/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/mnt", "/opt", "/proc",
	"/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/usr/local", "/var", "/var/lib"}

// ErrNotAbove marks a ParentsFile entry that is not a directory above the
// base it was checked against.
var ErrNotAbove = errors.New("not a directory above the base")

// MissingParents returns the host paths of hostPath's ancestors that do
// not exist, outermost first: what a MkdirAll of it would make above it.
func (r *Root) MissingParents(hostPath string) ([]string, error) {
	var missing []string
	for p := path.Dir(hostPath); p != "/"; p = path.Dir(p) {
		local, err := r.Resolve(p)
		if err != nil {
			return nil, err
		}
		if _, err := os.Lstat(local); err == nil {
			break
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		missing = append([]string{p}, missing...)
	}
	return missing, nil
}

// ensureBase makes the base if it is missing, with the directories above
// it, and records those (ParentsFile) for reset. A base that exists is
// left alone: only the run that made it knows what it made.
func (r *Root) ensureBase() error {
	base, err := r.Path()
	if err != nil {
		return err
	}
	if _, err := os.Lstat(base); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	parents, err := r.MissingParents(r.base)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", base, err)
	}
	return r.SaveParents(parents)
}

// parentsFile is ParentsFile: a JSON list of host paths. Entries are
// checked against a base when loaded (LoadParentsOf), as the list may have
// been made for another one.
var parentsFile = StateFile[[]string]{Name: ParentsFile, Max: 64 << 10, Perm: 0o644}

// SaveParents records parents (host paths above the base that kubeslot
// made) in ParentsFile; none removes the file.
func (r *Root) SaveParents(parents []string) error {
	if len(parents) == 0 {
		return parentsFile.Remove(r)
	}
	return parentsFile.Save(r, &parents)
}

// LoadParents reads ParentsFile; none when it is absent. Each entry must
// be an ancestor of the base: anything else is refused (ErrNotAbove), so a
// damaged file cannot make reset remove another directory.
func (r *Root) LoadParents() ([]string, error) { return r.LoadParentsOf(r.base) }

// LoadParentsOf is LoadParents for a list made for another base: the one a
// root move came from, whose list moved with the tree.
func (r *Root) LoadParentsOf(base string) ([]string, error) {
	f := parentsFile
	f.Validate = func(parents *[]string) error {
		for _, q := range *parents {
			if q == "/" || path.Clean(q) != q || !strings.HasPrefix(base, q+"/") {
				return fmt.Errorf("%q is %w %s", q, ErrNotAbove, base)
			}
		}
		return nil
	}
	parents, err := f.Load(r)
	if parents == nil {
		return nil, err
	}
	return *parents, nil
}

// RemoveParents removes parents (a LoadParents list, outermost first) from
// the innermost out, each only if it is an empty directory and never one
// of SystemDirs; it stops at the first that stays, as the ones around it
// cannot be empty then. It returns the host paths it removed.
func (r *Root) RemoveParents(parents []string) ([]string, error) {
	var removed []string
	for i := len(parents) - 1; i >= 0; i-- {
		if slices.Contains(SystemDirs, parents[i]) {
			continue
		}
		local, err := r.Resolve(parents[i])
		if err != nil {
			return removed, err
		}
		if ok, err := RemoveEmptyDir(local); err != nil || !ok {
			return removed, err
		}
		removed = append(removed, parents[i])
	}
	return removed, nil
}

// RemoveEmptyDir removes the local directory dir if it is empty, durably;
// one that is gone, holds something or is not a directory is left, and
// not an error.
func RemoveEmptyDir(dir string) (bool, error) {
	err := os.Remove(dir)
	switch {
	case err == nil:
		return true, atomicfile.SyncDir(filepath.Dir(dir))
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, syscall.EEXIST), errors.Is(err, syscall.ENOTDIR):
		return false, nil
	}
	return false, fmt.Errorf("remove %s: %w", dir, err)
}
