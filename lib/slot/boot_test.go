package slot

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
)

// TestBootLinksMove: the enable link moves from slot a to slot b with the
// same target, journalled before it is created; a second Move changes
// nothing.
func TestBootLinksMove(t *testing.T) {
	t.Parallel()
	root := testkit.Root(t)
	prefix := root.Prefix()
	rec := testhost.Owned(t, root, "node1", testhost.Sum)
	wants := filepath.Join(prefix, "etc/systemd/system/machines.target.wants")
	if err := os.MkdirAll(wants, 0o755); err != nil {
		t.Fatal(err)
	}
	const target = "/usr/lib/systemd/system/systemd-nspawn@.service"
	if err := os.Symlink(target, filepath.Join(wants, "systemd-nspawn@a.service")); err != nil {
		t.Fatal(err)
	}
	b := &BootLinks{Root: root, Record: rec, Log: slog.New(slog.DiscardHandler)}
	for range 2 {
		if err := b.Move(context.Background(), "a", "b"); err != nil {
			t.Fatal(err)
		}
		if got, err := os.Readlink(filepath.Join(wants, "systemd-nspawn@b.service")); err != nil || got != target {
			t.Errorf("link of b: %q, %v; want %q", got, err, target)
		}
		if _, err := os.Lstat(filepath.Join(wants, "systemd-nspawn@a.service")); err == nil {
			t.Error("slot a is still enabled at boot")
		}
	}
	saved, err := ownership.Load(root)
	if err != nil {
		t.Fatal(err)
	}
	c, found := saved.Lookup(ownership.KindUnit, "/etc/systemd/system/machines.target.wants/systemd-nspawn@b.service")
	if !found || c.Prior.State != ownership.PriorAbsent {
		t.Errorf("the new link is not journalled as created by kubeslot: %+v %v", c, found)
	}
	if ents, _ := os.ReadDir(wants); len(ents) != 1 {
		t.Errorf("entries left in %s: %v", wants, ents)
	}
}
