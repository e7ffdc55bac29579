package ownership

import (
	"bytes"
	"errors"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestJournalPersistedBeforeReturn(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	r := newRecord(t, "node-1", testFP)
	c := Change{Kind: KindFile, Path: "/etc/fstab", Prior: Prior{State: PriorFile, Mode: 0o644, Content: []byte("old fstab\n")}}
	if err := r.Record(root, c); err != nil {
		t.Fatal(err)
	}
	// No Save by the caller: the process could crash right here, after
	// making the change. Another process must find the entry on disk.
	disk, err := Load(root)
	if err != nil {
		t.Fatal(err)
	}
	if disk == nil || len(disk.Journal) != 1 {
		t.Fatalf("on disk after Record: %+v", disk)
	}
	got := disk.Journal[0]
	if got.Kind != KindFile || got.Path != "/etc/fstab" || !bytes.Equal(got.Prior.Content, []byte("old fstab\n")) || got.Prior.Mode != 0o644 {
		t.Errorf("entry on disk: %+v", got)
	}
	if got.At.IsZero() || !disk.UpdatedAt.Equal(got.At) {
		t.Errorf("entry at %v, record updatedAt %v", got.At, disk.UpdatedAt)
	}
	// The entry must not alias the caller's buffer.
	c.Prior.Content[0] = 'X'
	if r.Journal[0].Prior.Content[0] == 'X' {
		t.Error("journal entry shares the caller's content slice")
	}
}

func TestJournalDuplicateKeepsFirst(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	r := newRecord(t, "node-1", testFP)
	const p = "/etc/sysctl.d/90-kubeslot.conf"
	if err := r.Record(root, Change{Kind: KindSysctlFile, Path: p, Prior: Prior{State: PriorAbsent}}); err != nil {
		t.Fatal(err)
	}
	first := r.Journal[0]
	// A resumed bootstrap sees its own earlier file as "prior" now.
	if err := r.Record(root, Change{Kind: KindSysctlFile, Path: p, Prior: Prior{State: PriorFile, Mode: 0o644, Content: []byte("net.ipv4.ip_forward = 1\n")}}); err != nil {
		t.Fatal(err)
	}
	disk, err := Load(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range []*Record{r, disk} {
		if len(rec.Journal) != 1 {
			t.Fatalf("journal has %d entries, want 1: %+v", len(rec.Journal), rec.Journal)
		}
		if rec.Journal[0].Prior.State != PriorAbsent || !rec.Journal[0].At.Equal(first.At) {
			t.Errorf("duplicate replaced the first entry: %+v", rec.Journal[0])
		}
	}
	got, ok := r.Lookup(KindSysctlFile, p)
	if !ok || got.Prior.State != PriorAbsent {
		t.Errorf("Lookup = %+v, %v", got, ok)
	}
	// Same path, another kind: a separate entry (the key is kind + target).
	if err := r.Record(root, Change{Kind: KindFile, Path: p, Prior: Prior{State: PriorAbsent}}); err != nil {
		t.Fatal(err)
	}
	if len(r.Journal) != 2 {
		t.Errorf("journal has %d entries, want 2", len(r.Journal))
	}
	// Packages deduplicate by name.
	for range 2 {
		if err := r.Record(root, Change{Kind: KindPackage, Name: "systemd-container", Prior: Prior{State: PriorAbsent}}); err != nil {
			t.Fatal(err)
		}
	}
	if len(r.Journal) != 3 {
		t.Errorf("journal has %d entries, want 3", len(r.Journal))
	}
}

func TestJournalChangesReverse(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	r := newRecord(t, "node-1", testFP)
	paths := []string{"/var/lib/machines/a", "/etc/systemd/nspawn/a.nspawn", "/etc/systemd/system/kubeslot-node.service"}
	kinds := []Kind{KindMachineRootfs, KindNspawnSettings, KindUnit}
	for i, p := range paths {
		if err := r.Record(root, Change{Kind: kinds[i], Path: p, Prior: Prior{State: PriorAbsent}}); err != nil {
			t.Fatal(err)
		}
	}
	disk, err := Load(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range []*Record{r, disk} {
		got := rec.Changes()
		if len(got) != len(paths) {
			t.Fatalf("Changes() has %d entries, want %d", len(got), len(paths))
		}
		for i := range got {
			if want := paths[len(paths)-1-i]; got[i].Path != want {
				t.Errorf("Changes()[%d] = %s, want %s", i, got[i].Path, want)
			}
		}
		if !got[0].At.After(got[len(got)-1].At) {
			t.Errorf("newest entry at %v is not after oldest at %v", got[0].At, got[len(got)-1].At)
		}
		got[0].Path = "/changed"
		if rec.Journal[len(rec.Journal)-1].Path == "/changed" {
			t.Error("Changes() shares the journal's backing array")
		}
	}
}

func TestJournalRejectsInvalid(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	r := newRecord(t, "node-1", testFP)
	for _, tc := range []struct {
		c    Change
		want string
	}{
		{Change{Kind: "firmware", Path: "/x", Prior: Prior{State: PriorAbsent}}, `kind "firmware"`},
		{Change{Kind: KindFile, Path: "etc/fstab", Prior: Prior{State: PriorAbsent}}, `"etc/fstab"`},
		{Change{Kind: KindFile, Path: "/etc/../fstab", Prior: Prior{State: PriorAbsent}}, `"/etc/../fstab"`},
		{Change{Kind: KindFile, Path: "/", Prior: Prior{State: PriorAbsent}}, `path "/"`},
		{Change{Kind: KindPackage, Path: "/usr/bin/x", Name: "x", Prior: Prior{State: PriorAbsent}}, `path "/usr/bin/x"`},
		{Change{Kind: KindPackage, Prior: Prior{State: PriorAbsent}}, `name ""`},
		{Change{Kind: KindDir, Path: "/srv/x", Prior: Prior{State: PriorFile}}, `prior state "file"`},
		{Change{Kind: KindFile, Path: "/etc/x", Prior: Prior{State: ""}}, `prior state ""`},
		{Change{Kind: KindFile, Path: "/etc/x", Prior: Prior{State: PriorAbsent, Content: []byte("x")}}, "prior content given"},
		{Change{Kind: KindFile, Path: "/etc/x", Prior: Prior{State: PriorFile, Mode: 0o644 | os.ModeDir}}, "permission bits"},
		{Change{Kind: KindFile, Path: "/etc/x", Prior: Prior{State: PriorFile, Content: make([]byte, MaxPriorContent+1)}}, "too large"},
	} {
		err := r.Record(root, tc.c)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Record(%+v) = %v, want an error containing %q", tc.c, err, tc.want)
		}
	}
	if len(r.Journal) != 0 {
		t.Errorf("invalid changes were journalled: %+v", r.Journal)
	}
	if disk, err := Load(root); disk != nil || err != nil {
		t.Errorf("invalid changes were persisted: %+v, %v", disk, err)
	}
	if err := r.Record(root, Change{Kind: KindFile, Path: "/etc/x", Prior: Prior{State: PriorFile, Content: make([]byte, MaxPriorContent)}}); err != nil {
		t.Errorf("content of exactly MaxPriorContent refused: %v", err)
	}
}

func TestJournalSaveFailureRollsBack(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	r := newRecord(t, "node-1", testFP)
	if err := r.Record(root, Change{Kind: KindDir, Path: "/srv/a", Prior: Prior{State: PriorAbsent}}); err != nil {
		t.Fatal(err)
	}
	updated := r.UpdatedAt
	// Make the write fail: the record's directory is gone.
	if err := os.RemoveAll(filepath.Dir(recordPath(t, root))); err != nil {
		t.Fatal(err)
	}
	err := r.Record(root, Change{Kind: KindDir, Path: "/srv/b", Prior: Prior{State: PriorAbsent}})
	if err == nil {
		t.Fatal("Record succeeded although the record could not be written")
	}
	t.Logf("error: %v", err)
	if !strings.Contains(err.Error(), "/srv/b") {
		t.Errorf("error %q does not name the change", err)
	}
	if len(r.Journal) != 1 || !r.UpdatedAt.Equal(updated) {
		t.Errorf("failed Record left the change in memory: %+v", r.Journal)
	}
}

func TestCapturePrior(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	local := func(hostPath string) string {
		p, err := root.Resolve(hostPath)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if err := os.MkdirAll(local("/etc/sysctl.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(local("/etc/sysctl.d/10-host.conf"), []byte("vm.swappiness = 1\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(local("/etc/sysctl.d/10-host.conf"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(local("/etc/sysctl.d/big.conf"), make([]byte, MaxPriorContent+1), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/usr/lib/sysctl.d/x.conf", local("/etc/sysctl.d/99-link.conf")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(local("/etc/sysctl.d/fifo"), 0o600); err != nil {
		t.Fatal(err)
	}

	p, err := CapturePrior(root, "/etc/sysctl.d/90-kubeslot.conf")
	if err != nil || p.State != PriorAbsent {
		t.Errorf("absent file: %+v, %v", p, err)
	}
	p, err = CapturePrior(root, "/etc/sysctl.d/10-host.conf")
	if err != nil || p.State != PriorFile || p.Mode != 0o640 || string(p.Content) != "vm.swappiness = 1\n" || p.UID != os.Getuid() {
		t.Errorf("regular file: %+v, %v", p, err)
	}
	p, err = CapturePrior(root, "/etc/sysctl.d")
	if err != nil || p.State != PriorDir || p.Mode != 0o755 {
		t.Errorf("directory: %+v, %v", p, err)
	}
	p, err = CapturePrior(root, "/etc/sysctl.d/99-link.conf")
	if err != nil || p.State != PriorSymlink || p.Value != "/usr/lib/sysctl.d/x.conf" {
		t.Errorf("symlink (must not be followed): %+v, %v", p, err)
	}
	if _, err = CapturePrior(root, "/etc/sysctl.d/big.conf"); !errors.Is(err, ErrPriorTooLarge) || !strings.Contains(err.Error(), "big.conf") {
		t.Errorf("large file: %v, want ErrPriorTooLarge naming the file", err)
	}
	if _, err = CapturePrior(root, "/etc/sysctl.d/fifo"); err == nil || !strings.Contains(err.Error(), "refusing") {
		t.Errorf("fifo: %v, want a refusal", err)
	}
	if _, err = CapturePrior(root, "etc/x"); err == nil {
		t.Error("relative path accepted")
	}
	// A captured prior is accepted by Record as it is.
	p, err = CapturePrior(root, "/etc/sysctl.d/10-host.conf")
	if err != nil {
		t.Fatal(err)
	}
	r := newRecord(t, "node-1", testFP)
	if err := r.Record(root, Change{Kind: KindSysctlFile, Path: "/etc/sysctl.d/10-host.conf", Prior: p}); err != nil {
		t.Errorf("Record of a captured prior: %v", err)
	}
}

// Names the host would refuse, or take as options, are refused when
// journalled and when a record is loaded: reset runs
// apt-get remove with a package's name.
func TestJournalRejectsBadNames(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	r := newRecord(t, "node-1", testFP)
	for _, name := range []string{"systemd-container\nrm", "--purge", "-y", "Foo", "a b"} {
		if err := r.Record(root, Change{Kind: KindPackage, Name: name, Prior: Prior{State: PriorAbsent}}); err == nil {
			t.Errorf("package %q journalled", name)
		}
	}
	for _, name := range []string{"cni0\n", "-x", "a/b", strings.Repeat("n", 16)} {
		if err := r.Record(root, Change{Kind: KindPodNetwork, Name: name, Prior: Prior{State: PriorAbsent}}); err == nil {
			t.Errorf("pod network %q journalled", name)
		}
	}
	if err := r.Record(root, Change{Kind: KindPackage, Name: "libc6.1+x-2", Prior: Prior{State: PriorAbsent}}); err != nil {
		t.Errorf("a valid package name refused: %v", err)
	}
}
