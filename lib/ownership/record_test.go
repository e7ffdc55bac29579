package ownership

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

const (
	testFP    = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	otherFP   = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
	testAgent = "v0.1.0-test"
)

// stepClock returns a clock that advances one second per call from a fixed
// start, so every stamp is distinct and predictable.
func stepClock() func() time.Time {
	t := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	return func() time.Time {
		t = t.Add(time.Second)
		return t
	}
}

func newRecord(t *testing.T, machine, fp string) *Record {
	t.Helper()
	r, err := New(machine, fp, testAgent)
	if err != nil {
		t.Fatal(err)
	}
	// New stamps with the real time; restamp from the test clock.
	r.Clock = stepClock()
	r.CreatedAt = r.now()
	r.UpdatedAt = r.CreatedAt
	return r
}

func recordPath(t *testing.T, root *hostroot.Root) string {
	t.Helper()
	p, err := RecordPath(root)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNewRecord(t *testing.T) {
	t.Parallel()
	a := newRecord(t, "node-1", testFP)
	b := newRecord(t, "node-1", testFP)
	if len(a.InstallID) != 32 || !isHex(a.InstallID) {
		t.Errorf("installID %q: want 32 hex digits", a.InstallID)
	}
	if a.InstallID == b.InstallID {
		t.Errorf("two installations got the same ID %s", a.InstallID)
	}
	if a.SchemaVersion != SchemaVersion || a.Checkpoint != CheckpointPreparingHost || a.AgentVersion != testAgent {
		t.Errorf("new record: %+v", a)
	}
	if a.CreatedAt.IsZero() || !a.UpdatedAt.Equal(a.CreatedAt) {
		t.Errorf("createdAt %v updatedAt %v", a.CreatedAt, a.UpdatedAt)
	}
	for _, bad := range []struct{ machine, fp string }{
		{"", testFP}, {"node 1", testFP}, {"node-1", ""}, {"node-1", "ABCDEF"}, {"node-1", "sha256:00"},
	} {
		if _, err := New(bad.machine, bad.fp, testAgent); err == nil {
			t.Errorf("New(%q, %q): no error", bad.machine, bad.fp)
		}
	}
}

func TestRecordRoundTrip(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	r := newRecord(t, "node-1", testFP)
	if err := r.SetCheckpoint(CheckpointStartingNode); err != nil {
		t.Fatal(err)
	}
	if err := r.Record(root, Change{Kind: KindSysctlFile, Path: "/etc/sysctl.d/90-kubeslot.conf", Prior: Prior{State: PriorAbsent}}); err != nil {
		t.Fatal(err)
	}
	if err := r.Record(root, Change{Kind: KindFile, Path: "/etc/fstab", Prior: Prior{State: PriorFile, Mode: 0o644, Content: []byte("UUID=x / ext4\n\x00binary")}}); err != nil {
		t.Fatal(err)
	}
	if err := r.Record(root, Change{Kind: KindPackage, Name: "systemd-container", Prior: Prior{State: PriorAbsent}}); err != nil {
		t.Fatal(err)
	}
	if err := Save(root, r); err != nil {
		t.Fatal(err)
	}
	got, err := Load(root)
	if err != nil {
		t.Fatal(err)
	}
	want := *r
	want.Clock = nil
	if !reflect.DeepEqual(*got, want) {
		t.Errorf("round trip:\n got %+v\nwant %+v", *got, want)
	}
}

func TestLoadMissing(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	r, err := Load(root)
	if r != nil || err != nil {
		t.Fatalf("Load with no record = %v, %v; want nil, nil", r, err)
	}
	// Not even the base directory: still "no installation".
	bare := testkit.Root(t)
	if r, err := Load(bare); r != nil || err != nil {
		t.Fatalf("Load with no base = %v, %v; want nil, nil", r, err)
	}
}

func TestRecordFileMode(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	p := recordPath(t, root)
	// An existing, wider file must be narrowed too.
	if err := os.WriteFile(p, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Save(root, newRecord(t, "node-1", testFP)); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: mode %v, want 0600", p, fi.Mode().Perm())
	}
}

// writeMutated saves a valid record, lets mutate edit its JSON object, and
// writes the result back.
func writeMutated(t *testing.T, root *hostroot.Root, mutate func(m map[string]any)) {
	t.Helper()
	r := newRecord(t, "node-1", testFP)
	if err := r.Record(root, Change{Kind: KindDir, Path: "/var/lib/kubeslot-test", Prior: Prior{State: PriorAbsent}}); err != nil {
		t.Fatal(err)
	}
	p := recordPath(t, root)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	mutate(m)
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// wantDamaged asserts that Load refuses the record with a *DamagedError that
// names the file and contains every fragment.
func wantDamaged(t *testing.T, root *hostroot.Root, fragments ...string) {
	t.Helper()
	r, err := Load(root)
	if err == nil {
		t.Fatalf("Load of a damaged record succeeded: %+v", r)
	}
	t.Logf("error: %v", err)
	if r != nil {
		t.Errorf("Load returned a record with its error")
	}
	if !errors.Is(err, ErrDamagedRecord) {
		t.Errorf("error is not ErrDamagedRecord: %v", err)
	}
	msg := err.Error()
	for _, f := range append([]string{recordPath(t, root), "kubeslot-resetter"}, fragments...) {
		if !strings.Contains(msg, f) {
			t.Errorf("error %q does not contain %q", msg, f)
		}
	}
}

func TestLoadTornRecord(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	if err := Save(root, newRecord(t, "node-1", testFP)); err != nil {
		t.Fatal(err)
	}
	p := recordPath(t, root)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b[:len(b)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	wantDamaged(t, root, "not valid JSON (truncated write?)")

	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	wantDamaged(t, root, "empty")

	if err := os.WriteFile(p, append(b, []byte("{}")...), 0o600); err != nil {
		t.Fatal(err)
	}
	wantDamaged(t, root, "data after the record")
}

func TestLoadUnknownCheckpoint(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	writeMutated(t, root, func(m map[string]any) { m["checkpoint"] = "flying" })
	wantDamaged(t, root, `checkpoint "flying"`, "preparing-host")
}

func TestLoadUnknownSchemaVersion(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	writeMutated(t, root, func(m map[string]any) { m["schemaVersion"] = 2 })
	wantDamaged(t, root, "schemaVersion 2")

	writeMutated(t, root, func(m map[string]any) { delete(m, "schemaVersion") })
	wantDamaged(t, root, "schemaVersion 0")
}

func TestLoadRefusesOtherDamage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		mutate func(m map[string]any)
		want   string
	}{
		{"unknown field", func(m map[string]any) { m["undoHints"] = []string{"x"} }, "undoHints"},
		{"bad install ID", func(m map[string]any) { m["installID"] = "1234" }, `installID "1234"`},
		{"no machine", func(m map[string]any) { delete(m, "machine") }, `machine ""`},
		{"bad fingerprint", func(m map[string]any) { m["fingerprint"] = "XYZ" }, `fingerprint "XYZ"`},
		{"no createdAt", func(m map[string]any) { delete(m, "createdAt") }, "createdAt"},
		{"unknown journal kind", func(m map[string]any) {
			m["journal"].([]any)[0].(map[string]any)["kind"] = "firmware"
		}, `journal entry 0: kind "firmware"`},
		{"journal prior state", func(m map[string]any) {
			m["journal"].([]any)[0].(map[string]any)["prior"] = map[string]any{"state": "file"}
		}, `prior state "file"`},
		{"duplicate journal entry", func(m map[string]any) {
			j := m["journal"].([]any)
			m["journal"] = append(j, j[0])
		}, "journal entry 1: duplicates entry 0"},
		{"wrong type", func(m map[string]any) { m["schemaVersion"] = "one" }, "schemaVersion"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := testkit.LaidOut(t)
			writeMutated(t, root, tc.mutate)
			wantDamaged(t, root, tc.want)
		})
	}
}

func TestSaveRefusesInvalidRecord(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	p := recordPath(t, root)
	for _, mutate := range []func(r *Record){
		func(r *Record) { r.Checkpoint = "flying" },
		func(r *Record) { r.Fingerprint = "" },
		func(r *Record) { r.SchemaVersion = 2 },
		func(r *Record) { r.Journal = append(r.Journal, Change{Kind: "firmware", Path: "/x", At: r.CreatedAt}) },
	} {
		r := newRecord(t, "node-1", testFP)
		mutate(r)
		err := Save(root, r)
		if err == nil {
			t.Errorf("Save of an invalid record succeeded: %+v", r)
			continue
		}
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not name %s", err, p)
		}
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("invalid record was written (stat: %v)", err)
		}
	}
	if err := Save(root, nil); err == nil {
		t.Error("Save(nil) succeeded")
	}
}

func TestCheckpointOrder(t *testing.T) {
	t.Parallel()
	cps := InstallCheckpoints()
	if len(cps) != 5 || cps[0] != CheckpointPreparingHost || cps[4] != CheckpointComplete {
		t.Fatalf("InstallCheckpoints() = %v", cps)
	}
	for i, c := range cps {
		if !c.Valid() || c.Order() != i+1 {
			t.Errorf("%s: Valid %v Order %d, want true %d", c, c.Valid(), c.Order(), i+1)
		}
		for j, step := range cps {
			if got, want := c.Passed(step), j < i; got != want {
				t.Errorf("%s.Passed(%s) = %v, want %v", c, step, got, want)
			}
		}
		if CheckpointResetting.Passed(c) || c.Passed(CheckpointResetting) {
			t.Errorf("resetting and %s must not pass each other", c)
		}
	}
	if !CheckpointResetting.Valid() || CheckpointResetting.Order() != 0 {
		t.Errorf("resetting: Valid %v Order %d", CheckpointResetting.Valid(), CheckpointResetting.Order())
	}
	for _, c := range []Checkpoint{"", "Complete", "flying"} {
		if c.Valid() || c.Order() != 0 {
			t.Errorf("%q: Valid %v Order %d", c, c.Valid(), c.Order())
		}
	}
	cps[0] = "changed"
	if InstallCheckpoints()[0] != CheckpointPreparingHost {
		t.Error("InstallCheckpoints returns shared state")
	}
}

func TestSetCheckpoint(t *testing.T) {
	t.Parallel()
	r := newRecord(t, "node-1", testFP)
	before := r.UpdatedAt
	if err := r.SetCheckpoint(CheckpointInstallingUnits); err != nil {
		t.Fatal(err)
	}
	if r.Checkpoint != CheckpointInstallingUnits || !r.UpdatedAt.After(before) {
		t.Errorf("after SetCheckpoint: checkpoint %s updatedAt %v (was %v)", r.Checkpoint, r.UpdatedAt, before)
	}
	err := r.SetCheckpoint("flying")
	if err == nil || !strings.Contains(err.Error(), "flying") {
		t.Errorf("SetCheckpoint(flying) = %v", err)
	}
	if r.Checkpoint != CheckpointInstallingUnits {
		t.Errorf("invalid SetCheckpoint changed the checkpoint to %s", r.Checkpoint)
	}
}

func TestRemove(t *testing.T) {
	t.Parallel()
	root := testkit.LaidOut(t)
	if err := Save(root, newRecord(t, "node-1", testFP)); err != nil {
		t.Fatal(err)
	}
	if err := Remove(root); err != nil {
		t.Fatal(err)
	}
	if r, err := Load(root); r != nil || err != nil {
		t.Errorf("after Remove: Load = %v, %v", r, err)
	}
	if err := Remove(root); err != nil {
		t.Errorf("second Remove: %v", err)
	}
}

func TestShortFingerprint(t *testing.T) {
	t.Parallel()
	if got := ShortFingerprint(testFP); got != "0123456789ab" {
		t.Errorf("ShortFingerprint = %q", got)
	}
	if got := ShortFingerprint("abc"); got != "abc" {
		t.Errorf("ShortFingerprint(abc) = %q", got)
	}
}
