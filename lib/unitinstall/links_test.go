package unitinstall

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
)

// A link planted in a unit file's place, pointing out of the root prefix,
// is refused by name: neither replaced nor written through, and what it
// names is untouched.
func TestUnitLinkRefused(t *testing.T) {
	root := testkit.LaidOut(t)
	rec := testhost.Record(t, "host-1", testhost.Sum)
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("keep\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	unitDir := filepath.Join(root.Prefix(), "etc/systemd/system")
	if err := os.MkdirAll(unitDir, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(unitDir, "kubeslot-a.service")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	_, err := Install(root, rec, map[string][]byte{"kubeslot-a.service": []byte("[Service]\nExecStart=/bin/true\n")})
	if !errors.Is(err, hostroot.ErrLink) || !strings.Contains(err.Error(), "/etc/systemd/system/kubeslot-a.service") {
		t.Fatalf("install over a link: %v, want ErrLink naming the unit", err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the planted link was replaced: %v", err)
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "keep\n" {
		t.Errorf("the link's target changed: %q %v", b, err)
	}
	if len(rec.Changes()) != 0 {
		t.Errorf("a refused write was journalled: %v", rec.Changes())
	}
}
