package reset

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/hostprep"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/mountinfo"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/units"
)

func isNoMachine(err error) bool { return errors.Is(err, isolation.ErrNoMachine) }

// stepOrder is a step's position, for grouping directories.
func stepOrder(name string) int {
	for i, s := range Steps() {
		if s.Name == name {
			return i
		}
	}
	return -1
}

func isKubeslotUnit(name string) bool { return slices.Contains(units.Names(), name) }

func isPathUnit(name string) bool { return strings.HasSuffix(name, ".path") && isKubeslotUnit(name) }

// ownGroup is the step that undoes a journal entry that is not a directory.
func ownGroup(c ownership.Change) string {
	switch c.Kind {
	case ownership.KindNspawnSettings:
		return StepRemoveNspawn
	case ownership.KindMachineRootfs:
		return StepRemoveRootfs
	case ownership.KindUnit:
		b, dir := path.Base(c.Path), path.Dir(c.Path)
		link := dir != hostroot.UnitDir
		switch {
		case isolation.OwnsMachineUnit(c.Path):
			return StepRemoveNspawn
		case b == units.Bootstrap && (!link || strings.HasSuffix(dir, ".wants") || strings.HasSuffix(dir, ".requires")):
			return StepRemoveBootstrapUnit
		case isPathUnit(b) && link:
			return StepStopUnits
		case isKubeslotUnit(b):
			return StepRemoveUnits
		}
	}
	return StepUndoJournal
}

// groupOf is the step that undoes c. A directory kubeslot made is undone in
// the step that empties it: the latest step of the entries below it.
func groupOf(c ownership.Change, journal []ownership.Change) string {
	if c.Kind != ownership.KindDir {
		return ownGroup(c)
	}
	best := ""
	for _, o := range journal {
		if o.Kind == ownership.KindDir || o.Kind.UsesName() || !strings.HasPrefix(o.Path, c.Path+"/") {
			continue
		}
		if g := ownGroup(o); best == "" || stepOrder(g) > stepOrder(best) {
			best = g
		}
	}
	if best == "" {
		return StepUndoJournal
	}
	return best
}

// Group returns, newest first, the journal entries step undoes.
func Group(rec *ownership.Record, step string) []ownership.Change {
	var out []ownership.Change
	for _, c := range rec.Changes() {
		if groupOf(c, rec.Journal) == step {
			out = append(out, c)
		}
	}
	return out
}

// undoGroup undoes step's journal entries, newest first. It reports whether
// any of them was a unit file or link (systemd must reload).
func (r *runner) undoGroup(ctx context.Context, step string) (bool, error) {
	changed := false
	for _, c := range Group(r.rec, step) {
		if err := r.undo(ctx, c); err != nil {
			return changed, err
		}
		changed = changed || c.Kind == ownership.KindUnit
	}
	return changed, nil
}

// undo reverses one journal entry; what is already undone is success.
func (r *runner) undo(ctx context.Context, c ownership.Change) error {
	switch {
	case hostprep.Handles(c.Kind):
		return hostprep.Undo(ctx, r.d.Root, r.d.Sys, c, r.log)
	case c.Kind == ownership.KindMachineRootfs:
		return r.removeRootfsEntry(c)
	case c.Kind == ownership.KindFile, c.Kind == ownership.KindUnit, c.Kind == ownership.KindNspawnSettings:
		return restorePath(r.d.Root, c, r.log)
	}
	return fmt.Errorf("journal entry %s %s: this release does not know how to undo it; undo it by hand, then remove it from %s",
		c.Kind, c.Path, r.d.Root.HostPath(hostroot.OwnershipFile))
}

// removeRootfsEntry removes a slot tree kubeslot created; one that was
// there before kubeslot (prior dir) is left.
func (r *runner) removeRootfsEntry(c ownership.Change) error {
	if c.Prior.State != ownership.PriorAbsent {
		r.log.Warn("not removed: the directory was there before kubeslot", "path", c.Path)
		return nil
	}
	local, err := localEntry(r.d.Root, c.Path)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(local); isNotExist(err) {
		return nil
	}
	m, err := mountinfo.Under(local)
	if err != nil {
		return err
	}
	if len(m) > 0 {
		return fmt.Errorf("%s: mount points inside (%s): is its node still running? stop systemd-nspawn@ and unmount, then run kubeslot-resetter again", c.Path, strings.Join(m, ", "))
	}
	if err := os.RemoveAll(local); err != nil {
		return fmt.Errorf("remove %s: %w", c.Path, err)
	}
	r.log.Info("host change undone", "kind", c.Kind, "target", c.Path, "action", "removed")
	return atomicfile.SyncDir(filepath.Dir(local))
}

// restorePath puts back what was at c.Path before kubeslot: nothing (remove
// ours), a file (content, mode, owner) or a link.
func restorePath(root *hostroot.Root, c ownership.Change, log interface{ Info(string, ...any) }) error {
	local, err := localEntry(root, c.Path)
	if err != nil {
		return fmt.Errorf("undo %s %s: %w", c.Kind, c.Path, err)
	}
	switch c.Prior.State {
	case ownership.PriorAbsent:
		fi, err := os.Lstat(local)
		if isNotExist(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("undo %s %s: %w", c.Kind, c.Path, err)
		}
		if fi.IsDir() {
			return fmt.Errorf("undo %s %s: a directory is there now, not what kubeslot made: move it away, then run kubeslot-resetter again", c.Kind, c.Path)
		}
		if err := atomicfile.Remove(local); err != nil {
			return fmt.Errorf("undo %s %s: %w", c.Kind, c.Path, err)
		}
		log.Info("host change undone", "kind", c.Kind, "target", c.Path, "action", "removed")
		return nil
	case ownership.PriorFile:
		if err := os.MkdirAll(filepath.Dir(local), 0o755); err != nil {
			return fmt.Errorf("undo %s %s: %w", c.Kind, c.Path, err)
		}
		if err := atomicfile.WriteFile(local, c.Prior.Content, c.Prior.Mode.Perm()); err != nil {
			return fmt.Errorf("undo %s %s: %w", c.Kind, c.Path, err)
		}
		if err := os.Lchown(local, c.Prior.UID, c.Prior.GID); err != nil {
			return fmt.Errorf("undo %s %s: restore owner %d:%d: %w", c.Kind, c.Path, c.Prior.UID, c.Prior.GID, err)
		}
		log.Info("host change undone", "kind", c.Kind, "target", c.Path, "action", "restored prior file")
		return nil
	case ownership.PriorSymlink:
		if cur, err := os.Readlink(local); err == nil && cur == c.Prior.Value {
			return nil
		}
		if err := os.MkdirAll(filepath.Dir(local), 0o755); err != nil {
			return fmt.Errorf("undo %s %s: %w", c.Kind, c.Path, err)
		}
		if err := atomicfile.Symlink(c.Prior.Value, local); err != nil {
			return fmt.Errorf("undo %s %s: %w", c.Kind, c.Path, err)
		}
		log.Info("host change undone", "kind", c.Kind, "target", c.Path, "action", "restored prior link")
		return nil
	}
	return fmt.Errorf("undo %s %s: prior state %q: restore it by hand", c.Kind, c.Path, c.Prior.State)
}

// localEntry resolves hostPath's parent only, so a link at hostPath is
// itself removed or replaced, never followed.
func localEntry(root *hostroot.Root, hostPath string) (string, error) {
	dir, err := root.Resolve(path.Dir(hostPath))
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, path.Base(hostPath)), nil
}

// unitLinks are the enablement links of kubeslot unit name on this host:
// one per WantedBy=/RequiredBy= target of its [Install] section.
func (r *runner) unitLinks(name string) ([]string, error) {
	data, err := units.Render(name, units.Vars{Base: r.d.Root.Base()})
	if err != nil {
		return nil, err
	}
	return installLinks(name, data), nil
}

func installLinks(name string, data []byte) []string {
	var links []string
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "[") {
			section = line
			continue
		}
		key, val, ok := strings.Cut(line, "=")
		if section != "[Install]" || !ok {
			continue
		}
		suffix := map[string]string{"WantedBy": ".wants", "RequiredBy": ".requires"}[strings.TrimSpace(key)]
		if suffix == "" {
			continue
		}
		for _, target := range strings.Fields(val) {
			links = append(links, path.Join(hostroot.UnitDir, target+suffix, name))
		}
	}
	return links
}

// removeLinks removes the enablement links of kubeslot unit name that the
// journal does not cover (those are restored from it): links named exactly
// after kubeslot's own unit. It reports whether it removed any.
func (r *runner) removeLinks(name string) (bool, error) {
	links, err := r.unitLinks(name)
	if err != nil {
		return false, err
	}
	changed := false
	for _, l := range links {
		if _, found := r.rec.Lookup(ownership.KindUnit, l); found {
			continue
		}
		local, err := localEntry(r.d.Root, l)
		if err != nil {
			return changed, err
		}
		fi, err := os.Lstat(local)
		if isNotExist(err) {
			continue
		}
		if err != nil {
			return changed, err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			r.log.Warn("not removed: not a link", "path", l)
			continue
		}
		if err := atomicfile.Remove(local); err != nil {
			return changed, fmt.Errorf("disable %s: %w", name, err)
		}
		r.log.Info("unit disabled", "unit", name, "link", l)
		changed = true
	}
	return changed, nil
}

// removeUnitByName removes kubeslot unit file name and its links where the
// journal does not cover them (laid down by Ignition before any journal).
func (r *runner) removeUnitByName(name string) (bool, error) {
	changed := false
	if !strings.Contains(name, "@.") {
		c, err := r.removeLinks(name)
		if err != nil {
			return false, err
		}
		changed = c
	}
	p := path.Join(hostroot.UnitDir, name)
	if _, found := r.rec.Lookup(ownership.KindUnit, p); found {
		return changed, nil
	}
	local, err := localEntry(r.d.Root, p)
	if err != nil {
		return changed, err
	}
	fi, err := os.Lstat(local)
	if isNotExist(err) {
		return changed, nil
	}
	if err != nil {
		return changed, err
	}
	if fi.IsDir() {
		return changed, fmt.Errorf("%s is a directory: move it away, then run kubeslot-resetter again", p)
	}
	if err := atomicfile.Remove(local); err != nil {
		return changed, fmt.Errorf("remove %s: %w", p, err)
	}
	r.log.Info("unit file removed", "unit", name)
	return true, nil
}

// slotsOf lists the slots whose rootfs or settings the journal shows
// kubeslot made.
func slotsOf(rec *ownership.Record) []string {
	var out []string
	for _, c := range rec.Journal {
		var s string
		switch c.Kind {
		case ownership.KindMachineRootfs:
			s = path.Base(c.Path)
			if strings.HasPrefix(s, ".") && strings.HasSuffix(s, ".partial") {
				s = strings.TrimSuffix(strings.TrimPrefix(s, "."), ".partial")
			}
		case ownership.KindNspawnSettings:
			s = strings.TrimSuffix(path.Base(c.Path), ".nspawn")
		default:
			continue
		}
		if s != "" && !strings.ContainsAny(s, "/ ") && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}
