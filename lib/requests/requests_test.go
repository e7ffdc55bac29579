package requests

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/drain"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

func newDir(t *testing.T) (*Dir, *hostroot.Root) {
	t.Helper()
	root := testkit.Root(t)
	return New(root), root
}

func lock(t *testing.T, root *hostroot.Root) *ownership.Lock {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := ownership.Acquire(ctx, root, ownership.Holder{Stage: "test"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Release() })
	return l
}

func restart(gen int64, op string) *Request {
	return &Request{Kind: Restart, ID: NewID(Restart, gen, op), MachineGeneration: gen, Operation: op, Reason: "test"}
}

func TestWriteOnePerKindAndIdempotent(t *testing.T) {
	d, _ := newDir(t)
	wrote, err := d.Write(restart(1, "op-a"))
	if err != nil || !wrote {
		t.Fatalf("first write: %v %v", wrote, err)
	}
	if wrote, err := d.Write(restart(1, "op-a")); err != nil || wrote {
		t.Fatalf("same ID again: wrote=%v err=%v, want no write", wrote, err)
	}
	p, _ := d.RequestPath(Restart)
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("request file %s: %v mode %v, want 0600", p, err, fi.Mode())
	}
	// A newer request replaces the unclaimed one: one file per kind.
	if wrote, err := d.Write(restart(2, "op-b")); err != nil || !wrote {
		t.Fatalf("replace: %v %v", wrote, err)
	}
	r, err := d.Pending(Restart)
	if err != nil || r == nil || r.ID != "restart-2-op-b" {
		t.Fatalf("pending: %+v %v", r, err)
	}
}

func TestValidation(t *testing.T) {
	d, _ := newDir(t)
	cases := map[string]*Request{
		"bad kind":           {Kind: "reboot", ID: "reboot-1-x"},
		"id of another kind": {Kind: Restart, ID: "reset-1-x"},
		"id with a slash":    {Kind: Restart, ID: "restart-1-../x"},
		"repave no desired":  {Kind: Repave, ID: NewID(Repave, 1, "")},
		"upgrade no bundle":  {Kind: Upgrade, ID: NewID(Upgrade, 1, "op"), Upgrade: &UpgradeParams{URL: "http://x"}},
		"drain too long":     {Kind: Restart, ID: NewID(Restart, 1, "op"), Disruption: &drain.Policy{Timeout: time.Hour}},
		"drain action":       {Kind: Restart, ID: NewID(Restart, 1, "op"), Disruption: &drain.Policy{OnTimeout: "Later"}},
	}
	for name, r := range cases {
		if _, err := d.Write(r); err == nil {
			t.Errorf("%s: Write accepted %+v", name, r)
		}
	}
	if _, err := d.Write(&Request{Kind: Repave, ID: NewID(Repave, 3, ""), Desired: &config.Config{},
		Disruption: &drain.Policy{Timeout: time.Minute, OnTimeout: drain.Force}}); err != nil {
		t.Errorf("valid repave: %v", err)
	}
}

func TestClaim(t *testing.T) {
	d, root := newDir(t)
	if _, err := d.Claim(nil, Restart); err == nil {
		t.Fatal("claim without the lock succeeded")
	}
	l := lock(t, root)
	if _, err := d.Claim(l, Restart); !errors.Is(err, ErrNoRequest) {
		t.Fatalf("claim of nothing: %v, want ErrNoRequest", err)
	}
	d.Write(restart(1, "op-a"))
	r, err := d.Claim(l, Restart)
	if err != nil || r.ID != "restart-1-op-a" {
		t.Fatalf("claim: %+v %v", r, err)
	}
	if p, _ := d.Pending(Restart); p != nil {
		t.Fatalf("request still pending after claim: %+v", p)
	}
	// The same ID is not written again while claimed.
	if wrote, _ := d.Write(restart(1, "op-a")); wrote {
		t.Fatal("claimed request written again")
	}
	// A second claim (a worker restarted after a crash) resumes the claimed one.
	d.Write(restart(2, "op-b"))
	if r, err := d.Claim(l, Restart); err != nil || r.ID != "restart-1-op-a" {
		t.Fatalf("resume: %+v %v", r, err)
	}
	known, err := d.Known()
	if err != nil || !known["restart-1-op-a"] || !known["restart-2-op-b"] {
		t.Fatalf("known: %v %v", known, err)
	}
	if err := d.Finish(l, Restart); err != nil {
		t.Fatal(err)
	}
	if r, err := d.Claim(l, Restart); err != nil || r.ID != "restart-2-op-b" {
		t.Fatalf("claim after finish: %+v %v", r, err)
	}
}

func TestStatusAndPublished(t *testing.T) {
	d, _ := newDir(t)
	long := make([]byte, 3000)
	for i := range long {
		long[i] = 'x'
	}
	s := &Status{RequestID: "restart-1-op-a", Kind: Restart, Operation: "op-a", Phase: InProgress, Message: string(long),
		Phases: []PhaseTiming{{Name: "stop", StartedAt: time.Now(), Duration: time.Second}}}
	if err := d.WriteStatus(s); err != nil {
		t.Fatal(err)
	}
	got, err := d.ReadStatus("restart-1-op-a")
	if err != nil || got.Phase != InProgress || len(got.Message) != MaxMessage || got.UpdatedAt.IsZero() {
		t.Fatalf("read: %+v %v", got, err)
	}
	dir, _ := d.StatusDir()
	os.WriteFile(filepath.Join(dir, "reset-1-x.json"), []byte("{"), 0o600)
	os.WriteFile(filepath.Join(dir, ".restart-1-y.json.tmp-1"), []byte("{"), 0o600)
	list, bad, err := d.ListStatus()
	if err != nil || len(list) != 1 || len(bad) != 1 {
		t.Fatalf("list: %d good, %v bad, %v", len(list), bad, err)
	}
	if _, err := d.ReadStatus("../x"); err == nil {
		t.Fatal("status ID with a path accepted")
	}
	p, err := d.LoadPublished()
	if err != nil || len(p) != 0 {
		t.Fatalf("empty published: %v %v", p, err)
	}
	p["restart-1-op-a"] = Succeeded
	if err := d.SavePublished(p); err != nil {
		t.Fatal(err)
	}
	if p2, _ := d.LoadPublished(); p2["restart-1-op-a"] != Succeeded {
		t.Fatalf("published round trip: %v", p2)
	}
}

func TestPrune(t *testing.T) {
	d, _ := newDir(t)
	old := time.Now().Add(-48 * time.Hour)
	write := func(id string, k Kind, ph Phase, at time.Time) {
		t.Helper()
		path, _ := d.statusPath(id)
		if err := writeJSON(path, &Status{RequestID: id, Kind: k, Phase: ph, UpdatedAt: at}); err != nil {
			t.Fatal(err)
		}
	}
	write("restart-1-a", Restart, Succeeded, old)                  // old, published: pruned
	write("restart-2-b", Restart, Failed, old.Add(time.Hour))      // old, but not published as Failed: kept
	write("restart-3-c", Restart, Succeeded, old.Add(2*time.Hour)) // newest restart: kept
	write("reset-1-d", Reset, InProgress, old)                     // unfinished: kept
	write("repave-1-spec", Repave, Failed, old)                    // newest repave: kept
	p := Published{"restart-1-a": Succeeded, "restart-2-b": InProgress, "restart-3-c": Succeeded,
		"repave-1-spec": Failed, "restart-0-gone": Succeeded}
	removed, err := d.Prune(p, time.Now().Add(-24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != "restart-1-a" {
		t.Errorf("removed %v, want [restart-1-a]", removed)
	}
	if _, ok := p["restart-0-gone"]; ok {
		t.Error("marker entry without a status file kept")
	}
	if _, ok := p["restart-1-a"]; ok {
		t.Error("marker entry of a pruned status kept")
	}
	saved, _ := d.LoadPublished()
	if len(saved) != len(p) {
		t.Errorf("saved marker %v, want %v", saved, p)
	}
	st, _, _ := d.ListStatus()
	if len(st) != 4 {
		t.Errorf("%d statuses left, want 4", len(st))
	}
}

// A request file whose kind is not its file's, or that a worker cannot use,
// is moved aside with a Failed status: it never reaches a
// worker, is never claimed again, and never blocks the others.
func TestBadRequestMovedAside(t *testing.T) {
	d, root := newDir(t)
	l := lock(t, root)
	plant := func(p string, body string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// requests/repave.json holding a restart (no desired configuration): a
	// repaver given it as a repave dereferences nothing it needs.
	rp, _ := d.RequestPath(Repave)
	plant(rp, `{"kind":"restart","id":"restart-4-op-x","operation":"op-x","machineGeneration":4}`)
	// A claimed upgrade that is not JSON at all.
	cp, _ := d.ClaimedPath(Upgrade)
	plant(cp, "\x00garbage")
	// A claimed reset of the right kind next to a good pending one: the
	// claimed one is bad (its ID names another kind).
	cr, _ := d.ClaimedPath(Reset)
	plant(cr, `{"kind":"reset","id":"repave-9-spec"}`)
	d.Write(&Request{Kind: Reset, ID: NewID(Reset, 5, "op-r"), Operation: "op-r", MachineGeneration: 5})

	// The watcher's view never fails on them.
	if _, err := d.Known(); err != nil {
		t.Fatalf("Known with bad request files: %v", err)
	}
	if r, err := d.Claim(l, Repave); !errors.Is(err, ErrNoRequest) || r != nil {
		t.Fatalf("claim of a repave.json holding a restart: %+v %v, want ErrNoRequest", r, err)
	}
	if _, err := os.Stat(rp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("bad request still at %s: %v", rp, err)
	}
	s, err := d.ReadStatus("restart-4-op-x")
	if err != nil || s.Phase != Failed || s.Operation != "op-x" || s.MachineGeneration != 4 || !strings.Contains(s.Message, "repave.json") {
		t.Fatalf("status of the rejected request: %+v %v", s, err)
	}
	if r, err := d.Claim(l, Upgrade); !errors.Is(err, ErrNoRequest) || r != nil {
		t.Fatalf("claim of a garbage claimed upgrade: %+v %v", r, err)
	}
	if r, err := d.Claim(l, Reset); err != nil || r == nil || r.ID != "reset-5-op-r" {
		t.Fatalf("a bad claimed reset blocked the pending one: %+v %v", r, err)
	}
	if _, err := d.ReadStatus("repave-9-spec"); err == nil {
		t.Fatal("a reset file's content wrote a repave's status")
	}
	aside, err := d.Rejected()
	if err != nil || len(aside) != 3 {
		t.Fatalf("rejected files: %v %v, want 3", aside, err)
	}
	for _, a := range aside {
		if _, err := os.Stat(a.Path); err != nil {
			t.Errorf("moved-aside file %s: %v", a.Path, err)
		}
	}
	// Nothing left to claim a second time.
	for _, k := range []Kind{Repave, Upgrade} {
		if r, err := d.Claim(l, k); !errors.Is(err, ErrNoRequest) {
			t.Errorf("second claim of %s: %+v %v", k, r, err)
		}
	}
}

// Request files are read with no-follow semantics: a link in requests/ to a
// file outside the root prefix is not read through, a FIFO does not hang;
// both count as unusable and are moved aside.
func TestRequestLinkAndFIFONotRead(t *testing.T) {
	d, root := newDir(t)
	outside := filepath.Join(t.TempDir(), "restart.json")
	os.WriteFile(outside, []byte(`{"kind":"restart","id":"restart-1-op"}`), 0o600)
	p, _ := d.RequestPath(Restart)
	if err := os.Symlink(outside, p); err != nil {
		t.Fatal(err)
	}
	if r, err := d.Pending(Restart); !errors.Is(err, ErrInvalid) || r != nil {
		t.Fatalf("request through a link: %+v %v", r, err)
	}
	cp, _ := d.ClaimedPath(Reset)
	if err := syscall.Mkfifo(cp, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := d.Known(); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Known: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("reading a FIFO request hangs")
	}
	l := lock(t, root)
	if _, err := d.Claim(l, Restart); !errors.Is(err, ErrNoRequest) {
		t.Fatalf("claim: %v", err)
	}
	if _, err := d.Claim(l, Reset); !errors.Is(err, ErrNoRequest) {
		t.Fatalf("claim: %v", err)
	}
	if b, _ := os.ReadFile(outside); !strings.Contains(string(b), "restart-1-op") {
		t.Errorf("the link's target changed: %q", b)
	}
	if rej, _ := d.Rejected(); len(rej) != 2 {
		t.Errorf("rejected %v, want the link and the FIFO moved aside", rej)
	}
}

// The probation file round-trips, is absent as nil, and a damaged one is an
// error naming the file and the field.
func TestProbationFile(t *testing.T) {
	d, _ := newDir(t)
	if p, err := d.ReadProbation(); p != nil || err != nil {
		t.Fatalf("no file: %+v %v", p, err)
	}
	if err := d.WriteProbation(&Probation{RequestID: "upgrade-1-op", ToRelease: "green"}); err == nil {
		t.Error("a probation without a version was written")
	}
	in := &Probation{RequestID: "upgrade-1-op", Operation: "op", FromRelease: "blue", FromVersion: "v1", ToRelease: "green",
		ToVersion: "v2", SucceededAt: time.Now().UTC(), Reason: strings.Repeat("x", MaxMessage+10)}
	if err := d.WriteProbation(in); err != nil {
		t.Fatal(err)
	}
	got, err := d.ReadProbation()
	if err != nil || got.ToRelease != "green" || len(got.Reason) != MaxMessage || got.UpdatedAt.IsZero() || !got.RolledBackAt.IsZero() {
		t.Fatalf("read back %+v %v", got, err)
	}
	p, _ := d.ProbationPath()
	if err := os.WriteFile(p, []byte(`{"requestID":"upgrade-1-op","toRelease":"green"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ReadProbation(); err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "toVersion") {
		t.Errorf("damaged file: %v", err)
	}
	if err := d.RemoveProbation(); err != nil {
		t.Fatal(err)
	}
	if err := d.RemoveProbation(); err != nil {
		t.Errorf("second remove: %v", err)
	}
}
