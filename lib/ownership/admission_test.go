package ownership

import (
	"errors"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

// installed persists a record of node-1/testFP at checkpoint cp.
func installed(t *testing.T, root *hostroot.Root, cp Checkpoint) *Record {
	t.Helper()
	r := newRecord(t, "node-1", testFP)
	if err := r.SetCheckpoint(cp); err != nil {
		t.Fatal(err)
	}
	if err := Save(root, r); err != nil {
		t.Fatal(err)
	}
	return r
}

func wantContains(t *testing.T, err error, fragments ...string) {
	t.Helper()
	for _, f := range fragments {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error %q does not contain %q", err, f)
		}
	}
}

func TestAdmitFresh(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	d, r, err := Admit(root, "node-1", testFP)
	if d != Fresh || r != nil || err != nil {
		t.Fatalf("Admit on an empty host = %v, %v, %v; want fresh, nil, nil", d, r, err)
	}
	if d.String() != "fresh" {
		t.Errorf("String() = %q", d)
	}
	// The caller then creates the record; Admit now resumes it.
	r, err = New("node-1", testFP, testAgent)
	if err != nil {
		t.Fatal(err)
	}
	if err := Save(root, r); err != nil {
		t.Fatal(err)
	}
	d, got, err := Admit(root, "node-1", testFP)
	if d != Resume || err != nil || got == nil || got.InstallID != r.InstallID || got.Checkpoint != CheckpointPreparingHost {
		t.Errorf("Admit after New+Save = %v, %+v, %v", d, got, err)
	}
}

func TestAdmitResumeFromEachCheckpoint(t *testing.T) {
	t.Parallel()
	for _, cp := range InstallCheckpoints() {
		if cp == CheckpointComplete {
			continue
		}
		t.Run(string(cp), func(t *testing.T) {
			t.Parallel()
			root := testkit.LaidOut(t)
			want := installed(t, root, cp)
			d, r, err := Admit(root, "node-1", testFP)
			if err != nil {
				t.Fatal(err)
			}
			if d != Resume || r == nil || r.Checkpoint != cp || r.InstallID != want.InstallID {
				t.Errorf("Admit = %v, %+v; want resume from %s of %s", d, r, cp, want.InstallID)
			}
		})
	}
}

func TestAdmitComplete(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	want := installed(t, root, CheckpointComplete)
	d, r, err := Admit(root, "node-1", testFP)
	if err != nil {
		t.Fatal(err)
	}
	if d != Complete || r == nil || r.InstallID != want.InstallID {
		t.Errorf("Admit = %v, %+v; want complete", d, r)
	}
}

func TestAdmitRefusesDifferentMachine(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	old := installed(t, root, CheckpointComplete)
	d, r, err := Admit(root, "node-2", testFP)
	if !errors.Is(err, ErrDifferentInstallation) {
		t.Fatalf("Admit for another machine = %v, %v; want ErrDifferentInstallation", d, err)
	}
	t.Logf("error: %v", err)
	if d != 0 || r == nil || r.InstallID != old.InstallID {
		t.Errorf("refusal returned decision %v record %+v", d, r)
	}
	wantContains(t, err, `"node-1"`, `"node-2"`, ShortFingerprint(testFP), old.InstallID, "kubeslot-resetter", recordPath(t, root))
	if strings.Contains(err.Error(), testFP) {
		t.Errorf("error %q carries the whole fingerprint, want it shortened", err)
	}
}

func TestAdmitRefusesDifferentFingerprint(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	installed(t, root, CheckpointStartingNode)
	_, _, err := Admit(root, "node-1", otherFP)
	if !errors.Is(err, ErrDifferentInstallation) {
		t.Fatalf("Admit with another fingerprint: %v, want ErrDifferentInstallation", err)
	}
	t.Logf("error: %v", err)
	wantContains(t, err, `"node-1"`, "0123456789ab", "fedcba987654", "kubeslot-resetter")
}

func TestAdmitRefusesWhileResetting(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	old := installed(t, root, CheckpointResetting)
	// Resetting wins over everything, the same identity included.
	for _, id := range []struct{ machine, fp string }{{"node-1", testFP}, {"node-2", otherFP}} {
		d, r, err := Admit(root, id.machine, id.fp)
		if !errors.Is(err, ErrResetInProgress) {
			t.Fatalf("Admit(%s) while resetting = %v, %v; want ErrResetInProgress", id.machine, d, err)
		}
		if errors.Is(err, ErrDifferentInstallation) {
			t.Errorf("reset refusal also claims a different installation: %v", err)
		}
		t.Logf("error: %v", err)
		if r == nil || r.InstallID != old.InstallID {
			t.Errorf("refusal returned record %+v", r)
		}
		wantContains(t, err, "being reset", "finish the reset first", "kubeslot-resetter", `"node-1"`, old.InstallID)
	}
}

func TestAdmitDamagedRecord(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	writeMutated(t, root, func(m map[string]any) { m["checkpoint"] = "flying" })
	d, r, err := Admit(root, "node-1", testFP)
	if !errors.Is(err, ErrDamagedRecord) || d != 0 || r != nil {
		t.Errorf("Admit on a damaged record = %v, %v, %v; want ErrDamagedRecord", d, r, err)
	}
}

func TestAdmitRefusesBadArguments(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	for _, id := range []struct{ machine, fp string }{{"", testFP}, {"node-1", ""}, {"node-1", "XYZ"}} {
		if _, _, err := Admit(root, id.machine, id.fp); err == nil {
			t.Errorf("Admit(%q, %q) succeeded", id.machine, id.fp)
		}
	}
}
