package cachekeep

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/artifact"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/repave/repavestate"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
)

// configWith is the example configuration with the rootfs digest d.
func configWith(t *testing.T, d string) *config.Config {
	t.Helper()
	c := testhost.Example(t)
	c.RootFS.SHA256 = d
	return c
}

func hex(c byte) string { return strings.Repeat(string(c), 64) }

func put(t *testing.T, root *hostroot.Root, name string) {
	t.Helper()
	p, err := root.Path(hostroot.CacheDir, artifact.CacheSubdir, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(name), 0o644); err != nil {
		t.Fatal(err)
	}
}

func left(t *testing.T, root *hostroot.Root) []string {
	t.Helper()
	p, err := root.Path(hostroot.CacheDir, artifact.CacheSubdir)
	if err != nil {
		t.Fatal(err)
	}
	es, err := os.ReadDir(p)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

// TestInUse: the applied slots, a pending repave, a claimed upgrade and the
// repave in progress each keep their digests; a restart names none.
func TestInUse(t *testing.T) {
	root := testkit.LaidOut(t)
	applied := configWith(t, hex('a'))
	if err := state.NewStore(root).SaveApplied(&state.Applied{Slot: "a", Mode: "nspawn", Fingerprint: applied.Fingerprint(),
		AgentVersion: "test", AppliedAt: time.Now().UTC(), Config: applied}); err != nil {
		t.Fatal(err)
	}
	reqs := requests.New(root)
	if _, err := reqs.Write(&requests.Request{Kind: requests.Repave, ID: requests.NewID(requests.Repave, 2, ""), MachineGeneration: 2,
		Reason: "test", Desired: configWith(t, hex('b'))}); err != nil {
		t.Fatal(err)
	}
	up := &requests.Request{Kind: requests.Upgrade, ID: requests.NewID(requests.Upgrade, 2, "up"), MachineGeneration: 2,
		Operation: "up", Reason: "test", Upgrade: &requests.UpgradeParams{URL: "https://mirror.example/b.tar.gz", SHA256: hex('c')}}
	claimed, err := reqs.ClaimedPath(requests.Upgrade)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(up)
	if err := os.WriteFile(claimed, data, 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := repavestate.File.Path(root)
	if err != nil {
		t.Fatal(err)
	}
	data, _ = json.Marshal(map[string]any{"requestID": "by-hand", "phase": "prepare", "from": "a", "to": "b", "desired": configWith(t, hex('d'))})
	if err := os.WriteFile(st, data, 0o600); err != nil {
		t.Fatal(err)
	}
	keep, err := InUse(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{hex('a'), hex('b'), hex('c'), hex('d')} {
		if !slices.Contains(keep, d) {
			t.Errorf("%s… not kept: %v", d[:8], keep)
		}
	}
	for _, d := range applied.Digests() {
		if !slices.Contains(keep, d) {
			t.Errorf("the applied configuration's %s not kept", d)
		}
	}

	for _, n := range []string{hex('a'), hex('b'), hex('c'), hex('d'), hex('e'), "." + hex('e') + ".tmp-1"} {
		put(t, root, n)
	}
	if err := Prune(root, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	got := left(t, root)
	if slices.Contains(got, hex('e')) || slices.Contains(got, "."+hex('e')+".tmp-1") || len(got) != 4 {
		t.Errorf("after Prune: %v, want the four digests in use", got)
	}
}

// TestPruneWithUnreadableState: when something that may name a digest
// cannot be read, only the temporary files go.
func TestPruneWithUnreadableState(t *testing.T) {
	root := testkit.LaidOut(t)
	st, err := repavestate.File.Path(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(st, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	put(t, root, hex('e'))
	put(t, root, "."+hex('e')+".tmp-1")
	err = Prune(root, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "not pruned") || !strings.Contains(err.Error(), "repave state") {
		t.Errorf("Prune: %v, want an error naming the repave state", err)
	}
	if got := left(t, root); !slices.Equal(got, []string{hex('e')}) {
		t.Errorf("after a refused prune: %v, want the entry kept and the temporary file gone", got)
	}
}
