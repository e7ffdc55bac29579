package nspawn

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// A slot rootfs that is a link is refused by Provision, Configure and
// Remove, by name: otherwise Remove would delete the tree the link named (here
// /srv/precious, which under the prefix "/" is any tree of the host).
func TestSlotRootfsLinkRefused(t *testing.T) {
	e := newEnv(t)
	b := e.backend(nil)
	ctx := t.Context()
	if err := b.Provision(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	p := e.root.Prefix()
	precious := filepath.Join(p, "srv/precious")
	if err := os.MkdirAll(filepath.Dir(precious), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(p, "var/lib/machines/a"), precious); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/srv/precious", filepath.Join(p, "var/lib/machines/a")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(precious, "keep"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func() error{
		"remove":    func() error { return b.Remove(ctx, "a") },
		"provision": func() error { return b.Provision(ctx, "a") },
		"configure": func() error { return b.Configure(ctx, "a") },
	} {
		err := call()
		if !errors.Is(err, hostroot.ErrLink) || !strings.Contains(err.Error(), "/var/lib/machines/a") {
			t.Errorf("%s through a linked slot: %v, want ErrLink naming /var/lib/machines/a", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(precious, "keep")); err != nil {
		t.Errorf("the tree the slot link named was touched: %v", err)
	}
}

// The .nspawn file, the unit drop-in and its directory are not written
// through a link planted in their place, pointing out of the root prefix;
// Remove takes such a link away itself, never what it names.
func TestHostFileLinksRefused(t *testing.T) {
	for _, planted := range []string{"/etc/systemd/nspawn/a.nspawn", "/etc/systemd/system/systemd-nspawn@a.service.d",
		"/etc/systemd/system/systemd-nspawn@a.service.d/kubeslot.conf"} {
		t.Run(filepath.Base(planted), func(t *testing.T) {
			e := newEnv(t)
			b := e.backend(nil)
			ctx := t.Context()
			if err := b.Provision(ctx, "a"); err != nil {
				t.Fatal(err)
			}
			outside := t.TempDir()
			victim := filepath.Join(outside, "victim")
			if err := os.WriteFile(victim, []byte("keep\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			target := victim
			if strings.HasSuffix(planted, ".d") {
				target = outside
			}
			local := filepath.Join(e.root.Prefix(), planted)
			if err := os.MkdirAll(filepath.Dir(local), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, local); err != nil {
				t.Fatal(err)
			}
			err := b.Configure(ctx, "a")
			if !errors.Is(err, hostroot.ErrLink) || !strings.Contains(err.Error(), planted) {
				t.Errorf("configure: %v, want ErrLink naming %s", err, planted)
			}
			if fi, err := os.Lstat(local); err != nil || fi.Mode()&os.ModeSymlink == 0 {
				t.Errorf("the planted link was replaced: %v", err)
			}
			if err := b.Remove(ctx, "a"); err != nil && !errors.Is(err, hostroot.ErrLink) {
				t.Errorf("remove: %v", err)
			}
			ents, _ := os.ReadDir(outside)
			if b, err := os.ReadFile(victim); err != nil || string(b) != "keep\n" || len(ents) != 1 {
				t.Errorf("outside the root prefix changed: %q %v, %d entries", b, err, len(ents))
			}
		})
	}
}
