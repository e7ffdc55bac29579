package unitinstall

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
)

// TestChangesMatchesInstall: Changes lists exactly what Install then
// writes, and nothing once it has.
func TestChangesMatchesInstall(t *testing.T) {
	root := testkit.LaidOut(t)
	rec := testhost.Record(t, "host-1", testhost.Sum)
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

// TestDroppedAndRemove: a unit kubeslot installed that the next release
// lacks is found and removed with its enable link; an admin's own unit, a
// file kubeslot replaced (prior not absent) and another unit's link stay.
func TestDroppedAndRemove(t *testing.T) {
	root := testkit.LaidOut(t)
	rec := testhost.Record(t, "host-1", testhost.Sum)
	unit := func(wanted string) []byte {
		return []byte("[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=" + wanted + "\n")
	}
	// kubeslot-old.service was there before kubeslot (an admin's copy): its prior is a file.
	oldLocal, _ := LocalEntry(root, "/etc/systemd/system/kubeslot-old.service")
	if err := os.MkdirAll(filepath.Dir(oldLocal), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(oldLocal, []byte("# the admin's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	v1 := map[string][]byte{
		"kubeslot-a.service":     unit("multi-user.target"),
		"kubeslot-extra.service": unit("multi-user.target timers.target"),
		"kubeslot-old.service":   unit("multi-user.target"),
		"kubeslot-t@.service":    unit("multi-user.target"),
	}
	if _, err := Install(root, rec, v1); err != nil {
		t.Fatal(err)
	}
	// An admin's unit kubeslot never made, named like ours.
	mine, _ := LocalEntry(root, "/etc/systemd/system/kubeslot-admin.service")
	if err := os.WriteFile(mine, unit("multi-user.target"), 0o644); err != nil {
		t.Fatal(err)
	}
	v2 := map[string][]byte{"kubeslot-a.service": v1["kubeslot-a.service"]}
	got, err := Dropped(root, rec, v2)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"kubeslot-extra.service", "kubeslot-t@.service"}; !slices.Equal(got, want) {
		t.Fatalf("Dropped = %v, want %v", got, want)
	}
	removed, err := Remove(root, "kubeslot-extra.service")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/etc/systemd/system/multi-user.target.wants/kubeslot-extra.service",
		"/etc/systemd/system/timers.target.wants/kubeslot-extra.service", "/etc/systemd/system/kubeslot-extra.service"}
	if !slices.Equal(removed, want) {
		t.Errorf("Remove = %v, want %v", removed, want)
	}
	for _, p := range want {
		l, _ := LocalEntry(root, p)
		if _, err := os.Lstat(l); err == nil {
			t.Errorf("%s left", p)
		}
	}
	for _, p := range []string{"/etc/systemd/system/kubeslot-a.service", "/etc/systemd/system/multi-user.target.wants/kubeslot-a.service",
		"/etc/systemd/system/kubeslot-admin.service", "/etc/systemd/system/kubeslot-old.service"} {
		l, _ := LocalEntry(root, p)
		if _, err := os.Lstat(l); err != nil {
			t.Errorf("%s removed: %v", p, err)
		}
	}
	// Removed ones are not listed again; removing twice is nothing.
	if got, _ := Dropped(root, rec, v2); !slices.Equal(got, []string{"kubeslot-t@.service"}) {
		t.Errorf("Dropped after Remove = %v", got)
	}
	if again, err := Remove(root, "kubeslot-extra.service"); err != nil || len(again) != 0 {
		t.Errorf("Remove again = %v, %v", again, err)
	}
}
