package unitinstall

import (
	"os"
	"slices"
	"testing"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

// TestChangesMatchesInstall: Changes lists exactly what Install then
// writes, and nothing once it has.
func TestChangesMatchesInstall(t *testing.T) {
	root, err := hostroot.New(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	if err := root.EnsureLayout(); err != nil {
		t.Fatal(err)
	}
	rec, err := ownership.New("host-1", "abababababababababababababababababababababababababababababababab", "devel")
	if err != nil {
		t.Fatal(err)
	}
	rendered := map[string][]byte{
		"kubeslot-a.service":  []byte("[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n"),
		"kubeslot-b@.service": []byte("[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n"),
	}
	want := []string{"/etc/systemd/system/kubeslot-a.service", "/etc/systemd/system/multi-user.target.wants/kubeslot-a.service",
		"/etc/systemd/system/kubeslot-b@.service"}
	slices.Sort(want)
	before, err := Changes(root, rendered)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(before)
	if !slices.Equal(before, want) {
		t.Errorf("Changes %v, want %v", before, want)
	}
	changed, err := Install(root, rec, rendered)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(changed)
	if !slices.Equal(changed, want) {
		t.Errorf("Install changed %v, want %v", changed, want)
	}
	if after, _ := Changes(root, rendered); len(after) != 0 {
		t.Errorf("Changes after Install: %v", after)
	}
	for _, p := range want {
		if _, found := rec.Lookup(ownership.KindUnit, p); !found {
			t.Errorf("%s not journalled", p)
		}
	}
	// A changed mode is a change too.
	local, _ := LocalEntry(root, want[0])
	os.Chmod(local, 0o600)
	if after, _ := Changes(root, rendered); len(after) != 1 || after[0] != want[0] {
		t.Errorf("Changes after chmod: %v", after)
	}
}
