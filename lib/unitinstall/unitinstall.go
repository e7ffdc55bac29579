// Package unitinstall writes kubeslot's rendered unit files into
// /etc/systemd/system and enables them as `systemctl enable` would, each
// file, link and new directory journalled in the ownership record before it
// is made, so reset removes exactly what kubeslot made; Dropped and Remove
// take away the units a release no longer has. The caller renders the units
// (lib/units) and reloads systemd when something changed.
//
// Imported by lib/bootstrap (the first release's units, repair of a
// complete host), lib/upgrade (a new release's units, rollback) and
// lib/slot (a slot's boot links).
package unitinstall

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

// Install writes every unit of rendered (file name → content) that differs
// from what is in /etc/systemd/system and enables every unit with an
// [Install] section (links in <target>.wants/ or .requires/). It returns
// the host paths it changed; the caller reloads systemd when that is not
// empty. Units no longer in rendered are left alone here: see Dropped and
// Remove.
// maxUnitFile bounds what is read of a unit file already on the host.
const maxUnitFile = 1 << 20

func Install(root *hostroot.Root, rec *ownership.Record, rendered map[string][]byte) ([]string, error) {
	var changed []string
	for _, name := range slices.Sorted(maps.Keys(rendered)) {
		hostPath := path.Join(hostroot.UnitDir, name)
		ok, err := WriteUnit(root, rec, hostPath, rendered[name])
		if err != nil {
			return changed, err
		}
		if ok {
			changed = append(changed, hostPath)
		}
		if strings.Contains(name, "@.") {
			continue // a template is enabled per instance, by whoever needs one
		}
		for _, link := range Links(name, rendered[name]) {
			ok, err := EnsureLink(root, rec, link, hostPath)
			if err != nil {
				return changed, err
			}
			if ok {
				changed = append(changed, link)
			}
		}
	}
	return changed, nil
}

// Dropped lists the units kubeslot installed that rendered no longer has:
// unit files the journal records as made by kubeslot (nothing was there
// before), directly in /etc/systemd/system, named kubeslot-*, and still
// there. An upgrade to a release that dropped a unit, or a rollback from
// one that added it, removes them (after stopping them) with Remove.
func Dropped(root *hostroot.Root, rec *ownership.Record, rendered map[string][]byte) ([]string, error) {
	var out []string
	for _, c := range rec.Changes() {
		name := path.Base(c.Path)
		if c.Kind != ownership.KindUnit || path.Dir(c.Path) != hostroot.UnitDir || c.Prior.State != ownership.PriorAbsent ||
			!strings.HasPrefix(name, "kubeslot-") || rendered[name] != nil || slices.Contains(out, name) {
			continue
		}
		local, err := LocalEntry(root, c.Path)
		if err != nil {
			return nil, err
		}
		fi, err := os.Lstat(local)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if fi.Mode().IsRegular() {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// Remove deletes unit name's file from /etc/systemd/system and the
// enablement links its [Install] section made, and returns the host paths
// it removed. The journal keeps the entries: their prior is "absent", so
// reset's undo finds nothing left to do.
func Remove(root *hostroot.Root, name string) ([]string, error) {
	hostPath := path.Join(hostroot.UnitDir, name)
	local, err := LocalEntry(root, hostPath)
	if err != nil {
		return nil, err
	}
	data, err := hostroot.ReadRegular(local, maxUnitFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, link := range append(Links(name, data), hostPath) {
		l, err := LocalEntry(root, link)
		if err != nil {
			return removed, err
		}
		if link != hostPath {
			if target, err := os.Readlink(l); err != nil || target != hostPath {
				continue // not our link
			}
		}
		if err := os.Remove(l); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return removed, fmt.Errorf("remove %s: %w", link, err)
		}
		if err := atomicfile.SyncDir(filepath.Dir(l)); err != nil {
			return removed, err
		}
		removed = append(removed, link)
	}
	return removed, nil
}

// Changes lists, without changing anything, the host paths Install would
// write: unit files whose content or mode differs, and missing or different
// enablement links.
func Changes(root *hostroot.Root, rendered map[string][]byte) ([]string, error) {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(rendered)) {
		hostPath := path.Join(hostroot.UnitDir, name)
		local, err := LocalEntry(root, hostPath)
		if err != nil {
			return nil, err
		}
		if !sameFile(local, rendered[name]) {
			out = append(out, hostPath)
		}
		if strings.Contains(name, "@.") {
			continue
		}
		for _, link := range Links(name, rendered[name]) {
			local, err := LocalEntry(root, link)
			if err != nil {
				return nil, err
			}
			if old, err := os.Readlink(local); err != nil || old != hostPath {
				out = append(out, link)
			}
		}
	}
	return out, nil
}

func sameFile(local string, data []byte) bool {
	fi, err := os.Lstat(local)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
		return false
	}
	old, err := hostroot.ReadRegular(local, maxUnitFile)
	return err == nil && bytes.Equal(old, data)
}

// Links are the enablement links of unit name: one per target of
// WantedBy= and RequiredBy= in its [Install] section.
func Links(name string, data []byte) []string {
	var links []string
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
			continue
		case strings.HasPrefix(line, "["):
			section = line
			continue
		}
		if section != "[Install]" {
			continue
		}
		key, val, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		suffix := ""
		switch strings.TrimSpace(key) {
		case "WantedBy":
			suffix = ".wants"
		case "RequiredBy":
			suffix = ".requires"
		default:
			continue
		}
		for _, target := range strings.Fields(val) {
			links = append(links, path.Join(hostroot.UnitDir, target+suffix, name))
		}
	}
	return links
}

// Enabled reports whether unit data has an [Install] section that enables
// it somewhere (templates are enabled per instance, never here).
func Enabled(name string, data []byte) bool {
	return !strings.Contains(name, "@.") && len(Links(name, data)) > 0
}

// WriteUnit makes hostPath hold data (0644), journalling it first. It
// reports whether it wrote.
// A link in hostPath's place is refused (hostroot.ErrLink), not replaced:
// someone put it there, and neither it nor what it names is kubeslot's.
func WriteUnit(root *hostroot.Root, rec *ownership.Record, hostPath string, data []byte) (bool, error) {
	local, err := root.Entry(hostPath)
	if err != nil {
		return false, fmt.Errorf("write unit: %w", err)
	}
	if _, err := os.Lstat(local); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	if sameFile(local, data) {
		return false, nil
	}
	if err := EnsureDir(root, rec, path.Dir(hostPath)); err != nil {
		return false, err
	}
	if err := journal(root, rec, ownership.KindUnit, hostPath); err != nil {
		return false, err
	}
	if err := atomicfile.WriteFile(local, data, 0o644); err != nil {
		return false, err
	}
	return true, nil
}

// EnsureLink makes hostPath a symbolic link to target, journalling it (and
// a missing parent directory) first. It reports whether it changed it.
func EnsureLink(root *hostroot.Root, rec *ownership.Record, hostPath, target string) (bool, error) {
	local, err := LocalEntry(root, hostPath)
	if err != nil {
		return false, err
	}
	if old, err := os.Readlink(local); err == nil && old == target {
		return false, nil
	}
	if err := EnsureDir(root, rec, path.Dir(hostPath)); err != nil {
		return false, err
	}
	if err := journal(root, rec, ownership.KindUnit, hostPath); err != nil {
		return false, err
	}
	tmp := filepath.Join(filepath.Dir(local), ".kubeslot-link.tmp")
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	if err := os.Symlink(target, tmp); err != nil {
		return false, fmt.Errorf("link %s: %w", hostPath, err)
	}
	if err := atomicfile.Rename(tmp, local); err != nil {
		return false, fmt.Errorf("link %s: %w", hostPath, err)
	}
	return true, nil
}

// EnsureDir creates the host directory dir (0755) if missing, journalled.
func EnsureDir(root *hostroot.Root, rec *ownership.Record, dir string) error {
	local, err := root.Resolve(dir)
	if err != nil {
		return err
	}
	if fi, err := os.Stat(local); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s: exists and is not a directory", dir)
		}
		return nil
	}
	if err := EnsureDir(root, rec, path.Dir(dir)); err != nil {
		return err
	}
	if err := rec.Record(root, ownership.Change{Kind: ownership.KindDir, Path: dir, Prior: ownership.Prior{State: ownership.PriorAbsent}}); err != nil {
		return err
	}
	if err := os.Mkdir(local, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	return atomicfile.SyncDir(filepath.Dir(local))
}

func journal(root *hostroot.Root, rec *ownership.Record, kind ownership.Kind, hostPath string) error {
	if _, found := rec.Lookup(kind, hostPath); found {
		return nil
	}
	prior, err := ownership.CapturePrior(root, hostPath)
	if err != nil {
		return err
	}
	return rec.Record(root, ownership.Change{Kind: kind, Path: hostPath, Prior: prior})
}

// LocalEntry resolves hostPath's parent and appends its last component
// unresolved, so a link there is replaced, never followed.
func LocalEntry(root *hostroot.Root, hostPath string) (string, error) {
	dir, err := root.Resolve(path.Dir(hostPath))
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, path.Base(hostPath)), nil
}
