package migrate

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

const (
	oldBase = "/opt/old"
	newBase = "/srv/kubeslot"
)

// fakeSystemd records what the move asks of systemd.
type fakeSystemd struct{ calls []string }

func (f *fakeSystemd) StopUnit(_ context.Context, name string) error {
	f.calls = append(f.calls, "stop "+name)
	return nil
}

func (f *fakeSystemd) Reload(context.Context) error {
	f.calls = append(f.calls, "reload")
	return nil
}

// fixture lays down an installation at oldBase in a new prefix, with
// kubeslot's files outside the base naming it, and returns the prefix.
func fixture(t *testing.T) string {
	t.Helper()
	prefix := t.TempDir()
	old, err := hostroot.New(prefix, oldBase)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.EnsureLayout(); err != nil {
		t.Fatal(err)
	}
	rec, err := ownership.New("worker-1", strings.Repeat("ab", 32), "v1")
	if err != nil {
		t.Fatal(err)
	}
	rec.Checkpoint = ownership.CheckpointComplete
	if err := ownership.Save(old, rec); err != nil {
		t.Fatal(err)
	}
	for _, c := range []ownership.Change{
		{Kind: ownership.KindDir, Path: oldBase + "/node", Prior: ownership.Prior{State: ownership.PriorAbsent}},
		{Kind: ownership.KindUnit, Path: "/etc/systemd/system/kubeslot-watcher.service", Prior: ownership.Prior{State: ownership.PriorAbsent}},
		{Kind: ownership.KindDir, Path: "/opt/older", Prior: ownership.Prior{State: ownership.PriorAbsent}},
	} {
		if err := rec.Record(old, c); err != nil {
			t.Fatal(err)
		}
	}
	write := func(rel, data string, mode fs.FileMode) {
		p := filepath.Join(prefix, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
	}
	write(oldBase+"/releases/blue/kubeslot-watcher", "#!/bin/true\n", 0o755)
	write(oldBase+"/cache/trees/t1/rootfs/etc/os-release", "ID=node\n", 0o644)
	if err := os.Symlink("releases/blue", filepath.Join(prefix, oldBase, "current")); err != nil {
		t.Fatal(err)
	}
	write("/etc/systemd/system/kubeslot-watcher.service", "[Service]\nEnvironment=KUBESLOT_HOST_ROOT="+oldBase+"\nExecStart="+oldBase+"/current/kubeslot-watcher\n", 0o644)
	write("/etc/systemd/system/kubeslot-repave.path", "[Path]\nPathExists="+oldBase+"/requests/repave.json\n", 0o644)
	write("/etc/systemd/system/systemd-nspawn@a.service.d/kubeslot.conf", "[Unit]\nRequiresMountsFor="+oldBase+"/node\n", 0o644)
	write("/etc/systemd/nspawn/a.nspawn", "[Files]\nBind="+oldBase+"/identity:/var/lib/kubelet/pki\nBind=/opt/older/x:/y\nBind="+oldBase+"x:/z\n", 0o600)
	write("/etc/systemd/system/other.service", "ExecStart="+oldBase+"/current/kubeslot-watcher\n", 0o644)
	if err := os.MkdirAll(filepath.Join(prefix, "/var/lib/machines/.a.layers"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(oldBase+"/cache/trees/t1/rootfs", filepath.Join(prefix, "/var/lib/machines/.a.layers/tree")); err != nil {
		t.Fatal(err)
	}
	return prefix
}

// move finds the installation from newBase's point of view and runs the
// move, with after as its test hook.
func move(t *testing.T, prefix string, sd *fakeSystemd, after func(string) error) error {
	t.Helper()
	to, err := hostroot.New(prefix, newBase)
	if err != nil {
		t.Fatal(err)
	}
	from, err := FindLegacy(to)
	if err != nil {
		t.Fatal(err)
	}
	if from != oldBase {
		t.Fatalf("FindLegacy = %q, want %q", from, oldBase)
	}
	old, err := hostroot.New(prefix, from)
	if err != nil {
		t.Fatal(err)
	}
	return (&RootMove{From: old, To: to, Systemd: sd, Log: slog.New(slog.DiscardHandler), after: after}).Run(context.Background())
}

// tree lists every path under prefix with its mode and, for files and
// links, what it holds; the record's timestamps are left out.
func tree(t *testing.T, prefix string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(prefix, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(prefix, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		b.WriteString(rel + " " + fi.Mode().String())
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			b.WriteString(" -> " + target)
		case fi.Mode().IsRegular() && d.Name() != hostroot.OwnershipFile:
			data, _ := os.ReadFile(p)
			b.WriteString(" " + strings.ReplaceAll(string(data), "\n", "|"))
		}
		b.WriteString("\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func journalPaths(t *testing.T, prefix, base string) []string {
	t.Helper()
	r, _ := hostroot.New(prefix, base)
	rec, err := ownership.Load(r)
	if err != nil || rec == nil {
		t.Fatalf("record at %s: %v %v", base, rec, err)
	}
	var out []string
	for _, c := range rec.Changes() {
		out = append(out, c.Path)
	}
	return out
}

// TestRootMove: the whole move, then what each step left, then a second
// run that finds nothing to do.
func TestRootMove(t *testing.T) {
	prefix := fixture(t)
	sd := &fakeSystemd{}
	if err := move(t, prefix, sd, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(prefix, oldBase)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("old base still there: %v", err)
	}
	got := tree(t, prefix)
	for _, want := range []string{
		"srv/kubeslot/current Lrwxrwxrwx -> releases/blue",
		"srv/kubeslot/releases/blue/kubeslot-watcher -rwxr-xr-x #!/bin/true|",
		"srv/kubeslot/layout-version -rw-r--r-- 1|",
		"etc/systemd/system/kubeslot-watcher.service -rw-r--r-- [Service]|Environment=KUBESLOT_HOST_ROOT=/srv/kubeslot|ExecStart=/srv/kubeslot/current/kubeslot-watcher|",
		"etc/systemd/system/kubeslot-repave.path -rw-r--r-- [Path]|PathExists=/srv/kubeslot/requests/repave.json|",
		"etc/systemd/system/systemd-nspawn@a.service.d/kubeslot.conf -rw-r--r-- [Unit]|RequiresMountsFor=/srv/kubeslot/node|",
		// Another directory that starts with the same name is not the base.
		"etc/systemd/nspawn/a.nspawn -rw------- [Files]|Bind=/srv/kubeslot/identity:/var/lib/kubelet/pki|Bind=/opt/older/x:/y|Bind=/opt/oldx:/z|",
		// Not kubeslot's: left as it was.
		"etc/systemd/system/other.service -rw-r--r-- ExecStart=/opt/old/current/kubeslot-watcher|",
		"var/lib/machines/.a.layers/tree Lrwxrwxrwx -> /srv/kubeslot/cache/trees/t1/rootfs",
	} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("after the move, missing %q in:\n%s", want, got)
		}
	}
	if strings.Contains(got, StateFile) {
		t.Errorf("the checkpoint outlived the move:\n%s", got)
	}
	// The move made /srv (absent in this prefix) and records it for reset.
	if ps, err := mustRoot(t, prefix, newBase).LoadParents(); err != nil || !slices.Equal(ps, []string{"/srv"}) {
		t.Errorf("directories recorded above the new base: %v %v, want [/srv]", ps, err)
	}
	// Changes lists them in undo order, last recorded first.
	if want := []string{"/opt/older", "/etc/systemd/system/kubeslot-watcher.service", "/srv/kubeslot/node"}; !slices.Equal(journalPaths(t, prefix, newBase), want) {
		t.Errorf("journal paths %v, want %v", journalPaths(t, prefix, newBase), want)
	}
	wantCalls := []string{"stop kubeslot-repave.path", "stop kubeslot-restart.path", "stop kubeslot-upgrade.path", "stop kubeslot-reset.path", "stop kubeslot-watcher.service", "reload"}
	if !slices.Equal(sd.calls, wantCalls) {
		t.Errorf("systemd calls %v, want %v", sd.calls, wantCalls)
	}
	to, _ := hostroot.New(prefix, newBase)
	if from, err := FindLegacy(to); from != "" || err != nil {
		t.Errorf("after the move FindLegacy = %q, %v; want nothing to migrate", from, err)
	}
}

var errKilled = errors.New("killed")

// TestRootMoveResumesAfterKill: a run stopped after any step, resumed by
// the next (found again from what the first left), ends where an
// uninterrupted move ends.
func TestRootMoveResumesAfterKill(t *testing.T) {
	ref := fixture(t)
	if err := move(t, ref, &fakeSystemd{}, nil); err != nil {
		t.Fatal(err)
	}
	want := tree(t, ref)
	for _, s := range (&RootMove{Systemd: &fakeSystemd{}}).Steps() {
		t.Run(s.Name, func(t *testing.T) {
			prefix := fixture(t)
			err := move(t, prefix, &fakeSystemd{}, func(step string) error {
				if step == s.Name {
					return errKilled
				}
				return nil
			})
			if !errors.Is(err, errKilled) {
				t.Fatalf("first run: %v, want it killed after %s", err, s.Name)
			}
			if !strings.Contains(tree(t, prefix), StateFile) {
				t.Fatalf("killed after %s: no checkpoint left", s.Name)
			}
			sd := &fakeSystemd{}
			if err := move(t, prefix, sd, nil); err != nil {
				t.Fatalf("resumed run: %v", err)
			}
			if got := tree(t, prefix); got != want {
				t.Errorf("killed after %s and resumed:\n%s\nuninterrupted:\n%s", s.Name, got, want)
			}
			if !slices.Contains(sd.calls, "reload") {
				t.Errorf("resumed run did not reload systemd: %v", sd.calls)
			}
		})
	}
}

// TestMoveTreeRefusesTwoInstallations: files at both bases are never
// merged or overwritten.
func TestMoveTreeRefusesTwoInstallations(t *testing.T) {
	prefix := fixture(t)
	if err := os.MkdirAll(filepath.Join(prefix, newBase, "stray"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := move(t, prefix, &fakeSystemd{}, nil)
	if err == nil || !strings.Contains(err.Error(), "move-tree") || !strings.Contains(err.Error(), "both") {
		t.Fatalf("move onto a non-empty base: %v, want a refusal naming both bases", err)
	}
	if _, err := os.Stat(filepath.Join(prefix, oldBase, hostroot.OwnershipFile)); err != nil {
		t.Errorf("the old installation was touched: %v", err)
	}
}

// TestFindLegacy: only an installation elsewhere, named by the installed
// watcher unit and holding a record, is found; a base with its own
// installation finds nothing.
func TestFindLegacy(t *testing.T) {
	prefix := fixture(t)
	for _, c := range []struct {
		base, want string
	}{
		{newBase, oldBase},
		{oldBase, ""}, // the unit names this base: nothing elsewhere
	} {
		r, _ := hostroot.New(prefix, c.base)
		if got, err := FindLegacy(r); got != c.want || err != nil {
			t.Errorf("from %s: %q, %v; want %q", c.base, got, err, c.want)
		}
	}
	if err := os.Remove(filepath.Join(prefix, oldBase, hostroot.OwnershipFile)); err != nil {
		t.Fatal(err)
	}
	r, _ := hostroot.New(prefix, newBase)
	if got, err := FindLegacy(r); got != "" || err != nil {
		t.Errorf("old base without a record: %q, %v; want nothing", got, err)
	}
	if got, err := FindLegacy(mustRoot(t, t.TempDir(), newBase)); got != "" || err != nil {
		t.Errorf("no units at all: %q, %v; want nothing", got, err)
	}
}

func mustRoot(t *testing.T, prefix, base string) *hostroot.Root {
	t.Helper()
	r, err := hostroot.New(prefix, base)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestMoveDropsTheOldParents: the directories a first bootstrap made above
// the old base, recorded in its parents list, go with the move when empty;
// the list is the new base's afterwards.
func TestMoveDropsTheOldParents(t *testing.T) {
	prefix := t.TempDir()
	old := mustRoot(t, prefix, "/data/x/kubeslot")
	if err := old.EnsureLayout(); err != nil {
		t.Fatal(err)
	}
	if ps, err := old.LoadParents(); err != nil || !slices.Equal(ps, []string{"/data", "/data/x"}) {
		t.Fatalf("parents recorded at install: %v %v", ps, err)
	}
	to := mustRoot(t, prefix, "/new/kubeslot")
	if err := os.MkdirAll(filepath.Join(prefix, "new"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(prefix, "data/x/kubeslot"), filepath.Join(prefix, "new/kubeslot")); err != nil {
		t.Fatal(err)
	}
	m := &RootMove{From: old, To: to, Log: slog.New(slog.DiscardHandler)}
	for range 2 { // idempotent
		if err := m.dropOldParents(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Lstat(filepath.Join(prefix, "data")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("/data is still there: %v", err)
	}
	if ps, err := to.LoadParents(); err != nil || ps != nil {
		t.Errorf("the old list outlived the move: %v %v", ps, err)
	}
	// A new base's list, saved by a run killed before its step was done, is kept.
	if err := to.SaveParents([]string{"/new"}); err != nil {
		t.Fatal(err)
	}
	if err := m.dropOldParents(); err != nil {
		t.Fatal(err)
	}
	if ps, _ := to.LoadParents(); !slices.Equal(ps, []string{"/new"}) {
		t.Errorf("the new base's list was dropped: %v", ps)
	}
}
