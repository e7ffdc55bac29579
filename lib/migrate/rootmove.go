package migrate

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

// KindRootMove names the root move in the checkpoint.
const KindRootMove = "root-move"

// Systemd is what a root move asks of systemd.
type Systemd interface {
	StopUnit(ctx context.Context, name string) error
	Reload(ctx context.Context) error
}

// pointerUnit is the unit file that says where an installation lives: its
// KUBESLOT_HOST_ROOT= is the base its release was installed with. Only
// kubeslot writes it (the bootstrap unit may be the operator's, naming the
// new base).
const pointerUnit = "kubeslot-watcher.service"

// stopUnits are stopped before the tree moves, so that nothing writes into
// it meanwhile; the bootstrap starts them again from their re-rendered
// files (the node machine is never among them: it keeps running).
var stopUnits = []string{
	"kubeslot-repave.path", "kubeslot-restart.path", "kubeslot-upgrade.path", "kubeslot-reset.path",
	"kubeslot-watcher.service",
}

// maxHostFile bounds the unit and settings files rewritten.
const maxHostFile = 1 << 20

// RootMove moves the installation whose base is From.Base() to To.Base()
// (same root prefix), keeping layout version 1, without stopping the node
// machine: the tree is renamed in one filesystem (a running node's bind
// mounts follow the directories they were made from), the ownership
// journal's paths and kubeslot's unit, nspawn and mount files outside the
// base are rewritten to name the new base, links into the base re-pointed,
// and systemd reloaded.
type RootMove struct {
	From, To *hostroot.Root
	Systemd  Systemd
	Log      *slog.Logger
	// after is a test hook: called after each step.
	after func(step string) error
}

// FindLegacy returns the base of an installation this host has elsewhere
// than root.Base(), when root holds none: the base named by the installed
// watcher unit (a pointer every release leaves), if an ownership record
// is there; or the base a migration under way started from (its
// checkpoint in root). "" when there is nothing to migrate.
func FindLegacy(root *hostroot.Root) (string, error) {
	st, err := loadState(root)
	if err != nil || st != nil {
		if st != nil {
			return st.From, nil
		}
		return "", err
	}
	for _, f := range []string{hostroot.OwnershipFile, hostroot.LayoutFile} {
		p, err := root.File(f)
		if err != nil {
			return "", err
		}
		if _, err := os.Lstat(p); err == nil {
			return "", nil // an installation (or its remains) here
		}
	}
	local, err := root.Resolve(path.Join(hostroot.UnitDir, pointerUnit))
	if err != nil {
		return "", err
	}
	b, err := hostroot.ReadRegular(local, maxHostFile)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read %s: %w", local, err)
	}
	base := unitBase(b)
	if base == "" || base == root.Base() {
		return "", nil
	}
	old, err := hostroot.New(root.Prefix(), base)
	if err != nil {
		return "", fmt.Errorf("%s names host root %q: %w", local, base, err)
	}
	rec, err := old.File(hostroot.OwnershipFile)
	if err != nil {
		return "", err
	}
	if _, err := os.Lstat(rec); err != nil {
		return "", nil // the unit outlived its installation
	}
	return base, nil
}

// unitBase is the KUBESLOT_HOST_ROOT= a rendered kubeslot unit sets.
func unitBase(unit []byte) string {
	const key = "Environment=KUBESLOT_HOST_ROOT="
	var base string
	sc := bufio.NewScanner(bytes.NewReader(unit))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); strings.HasPrefix(l, key) {
			base = path.Clean(strings.TrimSpace(strings.TrimPrefix(l, key)))
		}
	}
	return base
}

// Steps are the root move's steps, in order.
func (m *RootMove) Steps() []Step {
	return []Step{
		{"stop-units", m.stopUnits},
		{"move-tree", m.moveTree},
		{"rewrite-journal", m.rewriteJournal},
		{"rewrite-host-files", m.rewriteHostFiles},
		{"reload", m.Systemd.Reload},
	}
}

// Run moves the installation, or resumes a move under way.
func (m *RootMove) Run(ctx context.Context) error {
	if m.From.Prefix() != m.To.Prefix() || m.From.Base() == m.To.Base() {
		return fmt.Errorf("root move from %s to %s: want two bases under one prefix", m.From.Base(), m.To.Base())
	}
	if strings.HasPrefix(m.To.Base()+"/", m.From.Base()+"/") || strings.HasPrefix(m.From.Base()+"/", m.To.Base()+"/") {
		return fmt.Errorf("root move from %s to %s: one base is inside the other", m.From.Base(), m.To.Base())
	}
	st := State{Kind: KindRootMove, From: m.From.Base(), To: m.To.Base(), Started: time.Now().UTC()}
	for _, r := range []*hostroot.Root{m.To, m.From} {
		old, err := loadState(r)
		if err != nil {
			return err
		}
		if old != nil {
			if old.Kind != KindRootMove || old.From != st.From || old.To != st.To {
				return fmt.Errorf("a %s migration from %s to %s is under way (%s in %s): finish it first", old.Kind, old.From, old.To, StateFile, r.HostPath(hostroot.StateDir))
			}
			st = *old
			break
		}
	}
	if st.Next == "" {
		m.Log.Info("moving the installation to the configured host root; the node keeps running", "from", st.From, "to", st.To)
	}
	return run(ctx, st, m.Steps(), m, m.Log, m.after)
}

// Save keeps the checkpoint in whichever base holds the tree now.
func (m *RootMove) Save(st State) error {
	r, err := m.holder()
	if err != nil {
		return err
	}
	return saveState(r, st)
}

// Remove drops the checkpoint: the move is finished.
func (m *RootMove) Remove() error {
	r, err := m.holder()
	if err != nil {
		return err
	}
	return removeState(r)
}

// holder is the root whose base holds the tree: From until the rename,
// To after it.
func (m *RootMove) holder() (*hostroot.Root, error) {
	from, err := m.From.Path()
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(from); err == nil {
		return m.From, nil
	}
	return m.To, nil
}

func (m *RootMove) stopUnits(ctx context.Context) error {
	for _, u := range stopUnits {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := m.Systemd.StopUnit(sctx, u)
		cancel()
		if err != nil {
			return fmt.Errorf("stop %s: %w", u, err)
		}
	}
	return nil
}

// moveTree renames the base in one step. Done when From is gone and To is
// there; an empty To (made ahead by an operator) is replaced. Across
// filesystems it refuses: a copy could not follow a running node, whose
// containerd writes into <base>/node through bind mounts of the old
// directories.
func (m *RootMove) moveTree(context.Context) error {
	from, err := m.From.Path()
	if err != nil {
		return err
	}
	to, err := m.To.Path()
	if err != nil {
		return err
	}
	_, ferr := os.Lstat(from)
	_, terr := os.Lstat(to)
	switch {
	case errors.Is(ferr, fs.ErrNotExist) && terr == nil:
		return m.dropOldParents() // renamed by an earlier run
	case ferr != nil:
		return fmt.Errorf("%s: %w", from, ferr)
	case terr == nil:
		if err := os.Remove(to); err != nil {
			return fmt.Errorf("%s exists and is not an empty directory: both %s and %s hold files; move one aside", to, m.From.Base(), m.To.Base())
		}
	case !errors.Is(terr, fs.ErrNotExist):
		return terr
	}
	made, err := m.To.MissingParents(m.To.Base())
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	if err := atomicfile.Rename(from, to); err != nil {
		if errors.Is(err, syscall.EXDEV) {
			return fmt.Errorf("%s and %s are on different filesystems: moving a running node's state across filesystems is not supported; pick a base on the same filesystem, or reset and bootstrap again: %w", m.From.Base(), m.To.Base(), err)
		}
		return err
	}
	if err := m.dropOldParents(); err != nil {
		return err
	}
	// What this run made above the new base, for reset (a kill right
	// before this line leaves them unrecorded: empty directories).
	return m.To.SaveParents(made)
}

// dropOldParents removes, empty, the directories kubeslot made above the
// old base (its hostroot.ParentsFile, moved with the tree), and the list.
func (m *RootMove) dropOldParents() error {
	parents, err := m.To.LoadParentsOf(m.From.Base())
	if errors.Is(err, hostroot.ErrNotAbove) {
		return nil // the new base's list, saved by an earlier run
	}
	if err != nil {
		m.Log.Warn("the list of directories made above the old base is unusable; left as they are", "err", err.Error())
		parents = nil
	}
	removed, err := m.To.RemoveParents(parents)
	for _, q := range removed {
		m.Log.Info("directory made above the old base removed", "path", q)
	}
	if err != nil { // a leftover directory, not a reason to stop the move
		m.Log.Warn("a directory made above the old base was not removed", "err", err.Error())
	}
	return m.To.SaveParents(nil)
}

// rewriteJournal carries the ownership record's journal over: entries
// naming paths in the old base name the new one, so that a reset undoes
// them there.
func (m *RootMove) rewriteJournal(context.Context) error {
	rec, err := ownership.Load(m.To)
	if err != nil {
		return err
	}
	if rec == nil {
		return fmt.Errorf("no ownership record in %s after the move", m.To.Base())
	}
	changed := false
	for i, c := range rec.Journal {
		if p, ok := rebase(c.Path, m.From.Base(), m.To.Base()); ok {
			rec.Journal[i].Path, changed = p, true
		}
		if c.Prior.State == ownership.PriorSymlink {
			if v, ok := rebase(c.Prior.Value, m.From.Base(), m.To.Base()); ok {
				rec.Journal[i].Prior.Value, changed = v, true
			}
		}
	}
	if !changed {
		return nil
	}
	return ownership.Save(m.To, rec)
}

// rebase returns p with the prefix from replaced by to, when p is from or
// inside it.
func rebase(p, from, to string) (string, bool) {
	if p == from {
		return to, true
	}
	if rest, ok := strings.CutPrefix(p, from+"/"); ok {
		return to + "/" + rest, true
	}
	return "", false
}

// rewriteHostFiles rewrites kubeslot's files outside the base that name
// the old base (unit files, drop-ins, nspawn settings, mount units, a
// layered slot's layers.json) and re-points links into it (a layered
// slot's links to its lowers). Each file is replaced atomically, with its
// mode; a file already rewritten is left alone.
func (m *RootMove) rewriteHostFiles(context.Context) error {
	var files []string
	for _, g := range []struct{ dir, pattern string }{
		{hostroot.UnitDir, "kubeslot-*"},
		{hostroot.UnitDir, "systemd-nspawn@*.service.d/kubeslot.conf"},
		{hostroot.UnitDir, "var-lib-machines-*.mount"},
		{hostroot.NspawnDir, "*.nspawn"},
		{hostroot.MachinesDir, ".*.layers/*"},
	} {
		local, err := m.To.Resolve(g.dir)
		if err != nil {
			return err
		}
		matches, err := filepath.Glob(filepath.Join(local, g.pattern))
		if err != nil {
			return err
		}
		files = append(files, matches...)
	}
	re := regexp.MustCompile(regexp.QuoteMeta(m.From.Base()) + `(/|$|[\s:"'=])`)
	for _, f := range files {
		if err := m.rewriteOne(f, re); err != nil {
			return err
		}
	}
	return nil
}

func (m *RootMove) rewriteOne(f string, re *regexp.Regexp) error {
	fi, err := os.Lstat(f)
	if err != nil {
		return err
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(f)
		if err != nil {
			return err
		}
		if t, ok := rebase(target, m.From.Base(), m.To.Base()); ok {
			m.Log.Info("link re-pointed", "link", f, "to", t)
			return atomicfile.Symlink(t, f)
		}
	case fi.Mode().IsRegular():
		b, err := hostroot.ReadRegular(f, maxHostFile)
		if err != nil {
			return err
		}
		out := re.ReplaceAll(b, []byte(m.To.Base()+"$1"))
		if !bytes.Equal(out, b) {
			m.Log.Info("file rewritten for the new host root", "file", f)
			return atomicfile.WriteFile(f, out, fi.Mode().Perm())
		}
	}
	return nil
}
