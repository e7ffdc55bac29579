package bootstrap

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/units"
)

// Watcher is the unit started at the end of a bootstrap (and kept active
// by a complete-host run) when this release has it.
const Watcher = "kubeslot-watcher.service"

// startTimeout bounds starting one unit.
const startTimeout = time.Minute

// Where systemd keeps the units of the nspawn machines, tried in order.
var vendorUnitDirs = []string{"/usr/lib/systemd/system", "/lib/systemd/system"}

// renderedUnits is every kubeslot unit for this host root.
func renderedUnits(root *hostroot.Root) (map[string][]byte, error) {
	return units.All(units.Vars{Base: root.Base()})
}

// installUnits writes every kubeslot unit that differs from this release's
// into /etc/systemd/system and enables every unit with an [Install]
// section, as `systemctl enable` would (links in <target>.wants/ or
// .requires/). Each file, link and new directory is journalled as a unit
// change before it is made, so reset removes exactly them. It returns what
// it changed; the caller reloads systemd when that is not empty.
func installUnits(root *hostroot.Root, rec *ownership.Record) ([]string, error) {
	all, err := renderedUnits(root)
	if err != nil {
		return nil, err
	}
	var changed []string
	for _, name := range sortedKeys(all) {
		hostPath := path.Join(hostroot.UnitDir, name)
		ok, err := writeUnit(root, rec, hostPath, all[name])
		if err != nil {
			return changed, err
		}
		if ok {
			changed = append(changed, hostPath)
		}
		if strings.Contains(name, "@.") {
			continue // a template is enabled per instance, by whoever needs one
		}
		for _, link := range installLinks(name, all[name]) {
			ok, err := ensureLink(root, rec, link, hostPath)
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

// installLinks are the enablement links of unit name: one per target of
// WantedBy= and RequiredBy= in its [Install] section.
func installLinks(name string, data []byte) []string {
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

// enabled reports whether unit data has an [Install] section that enables
// it somewhere.
func enabled(name string, data []byte) bool {
	return !strings.Contains(name, "@.") && len(installLinks(name, data)) > 0
}

// writeUnit makes hostPath hold data (0644), journalling it first.
func writeUnit(root *hostroot.Root, rec *ownership.Record, hostPath string, data []byte) (bool, error) {
	local, err := localEntry(root, hostPath)
	if err != nil {
		return false, err
	}
	if fi, err := os.Lstat(local); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm() == 0o644 {
		if old, err := os.ReadFile(local); err == nil && bytes.Equal(old, data) {
			return false, nil
		}
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	if err := ensureDir(root, rec, path.Dir(hostPath)); err != nil {
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

// ensureLink makes hostPath a symbolic link to target, journalling it (and
// a missing parent directory) first.
func ensureLink(root *hostroot.Root, rec *ownership.Record, hostPath, target string) (bool, error) {
	local, err := localEntry(root, hostPath)
	if err != nil {
		return false, err
	}
	if old, err := os.Readlink(local); err == nil && old == target {
		return false, nil
	}
	if err := ensureDir(root, rec, path.Dir(hostPath)); err != nil {
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

// ensureDir creates the host directory dir (0755) if missing, journalled.
func ensureDir(root *hostroot.Root, rec *ownership.Record, dir string) error {
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
	if err := ensureDir(root, rec, path.Dir(dir)); err != nil {
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

// localEntry resolves hostPath's parent and appends its last component
// unresolved, so a link there is replaced, never followed.
func localEntry(root *hostroot.Root, hostPath string) (string, error) {
	dir, err := root.Resolve(path.Dir(hostPath))
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, path.Base(hostPath)), nil
}

// machineUnit is the host unit that runs slot's node.
func machineUnit(slot string) string { return "systemd-nspawn@" + slot + ".service" }

// enableMachine makes slot's node start at host boot: the instance
// systemd-nspawn@<slot>.service wanted by machines.target, and
// machines.target wanted by multi-user.target, as `machinectl enable`
// does. Both links are journalled unit changes, so reset removes them.
func enableMachine(root *hostroot.Root, rec *ownership.Record, slot string) (bool, error) {
	changed := false
	links := []struct{ link, unit string }{
		{path.Join(hostroot.UnitDir, "machines.target.wants", machineUnit(slot)), "systemd-nspawn@.service"},
		{path.Join(hostroot.UnitDir, "multi-user.target.wants", "machines.target"), "machines.target"},
	}
	for _, l := range links {
		if l.unit == "machines.target" {
			// Enabled by the host's own configuration already: leave it.
			if local, err := localEntry(root, l.link); err == nil {
				if _, err := os.Lstat(local); err == nil {
					continue
				}
			}
		}
		ok, err := ensureLink(root, rec, l.link, vendorUnit(root, l.unit))
		if err != nil {
			return changed, fmt.Errorf("enable %s at boot: %w", machineUnit(slot), err)
		}
		changed = changed || ok
	}
	return changed, nil
}

// vendorUnit is the host path of a unit systemd ships.
func vendorUnit(root *hostroot.Root, name string) string {
	for _, dir := range vendorUnitDirs {
		if local, err := root.Resolve(path.Join(dir, name)); err == nil {
			if _, err := os.Stat(local); err == nil {
				return path.Join(dir, name)
			}
		}
	}
	return path.Join(vendorUnitDirs[0], name)
}

// ensureActive starts every enabled kubeslot unit that is not active
// (except the bootstrap itself, which is this run): the watcher and the
// path units. Best effort: a unit that does not start is logged; it is
// enabled, and the next boot's run tries again. A release without the
// watcher unit is logged as such.
func ensureActive(ctx context.Context, d Deps, log *slog.Logger) []string {
	all, err := renderedUnits(d.Root)
	if err != nil {
		log.Warn("render units", "err", err)
		return nil
	}
	if _, ok := all[Watcher]; !ok {
		log.Warn("this release has no watcher unit yet: not started", "unit", Watcher)
	}
	var started []string
	for _, name := range sortedKeys(all) {
		if name == units.Bootstrap || !enabled(name, all[name]) {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, startTimeout)
		active, _, err := d.Systemd.UnitState(sctx, name)
		if err == nil && active != "active" && active != "activating" && active != "reloading" {
			err = d.Systemd.StartUnit(sctx, name)
			if err == nil {
				started = append(started, name+" started")
			}
		}
		cancel()
		if err != nil {
			log.Warn("unit not active, and starting it failed; the next run tries again", "unit", name, "err", err)
		}
	}
	return started
}

func sortedKeys(m map[string][]byte) []string { return slices.Sorted(maps.Keys(m)) }
