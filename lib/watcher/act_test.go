package watcher

import (
	"log/slog"
	"os"
	"testing"

	"k8s.io/client-go/tools/cache"

	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

// An unusable request file (another kind's request, not JSON) never stops
// the watcher from reading the host root (issue 17, item 4): its worker moves
// it aside; the watcher decides on everything else.
func TestInputsIgnoreUnusableRequests(t *testing.T) {
	root := testkit.Root(t)
	dir := requests.New(root)
	l := &loop{Options: Options{Log: slog.New(slog.NewTextHandler(t.Output(), nil)), MachineName: "m", NodeName: "m"},
		dir: dir, store: state.NewStore(root),
		machine: cache.NewStore(cache.MetaNamespaceKeyFunc), node: cache.NewStore(cache.MetaNamespaceKeyFunc),
		ops: cache.NewStore(cache.MetaNamespaceKeyFunc)}
	rp, _ := dir.RequestPath(requests.Repave)
	if err := os.WriteFile(rp, []byte(`{"kind":"restart","id":"restart-4-op-x"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cp, _ := dir.ClaimedPath(requests.Upgrade)
	if err := os.WriteFile(cp, []byte("not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := dir.Write(&requests.Request{Kind: requests.Restart, ID: requests.NewID(requests.Restart, 2, "op"), Operation: "op"}); err != nil {
		t.Fatal(err)
	}
	in, err := l.inputs()
	if err != nil {
		t.Fatalf("inputs with unusable request files: %v", err)
	}
	if in.Pending[requests.Repave] != nil || in.Claimed[requests.Upgrade] != nil {
		t.Errorf("unusable requests taken as real: %+v %+v", in.Pending[requests.Repave], in.Claimed[requests.Upgrade])
	}
	if r := in.Pending[requests.Restart]; r == nil || r.ID != "restart-2-op" {
		t.Errorf("the good restart request is not seen: %+v", r)
	}
}
