package watcher

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/isolation"
)

func TestNodeAddrProblem(t *testing.T) {
	old := hostAddrs
	t.Cleanup(func() { hostAddrs = old })
	hostAddrs = func() ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.0.0.77")}, nil
	}
	rec := isolation.HookRecord{Slot: "a", NodeIP: "10.0.0.77"}
	for _, c := range []struct {
		name     string
		rec      isolation.HookRecord
		found    bool
		slot     string
		internal []string
		want     string // a part of the problem; "" none
	}{
		{"matches", rec, true, "a", []string{"10.0.0.77"}, ""},
		{"no hook record: nothing to check", rec, false, "a", []string{"10.0.0.5"}, ""},
		{"the record is another slot's", rec, true, "b", []string{"10.0.0.5"}, ""},
		{"no address reported yet", rec, true, "a", nil, ""},
		{"an address the host no longer has", rec, true, "a", []string{"10.0.0.5"}, "10.0.0.5, which this host no longer has (it has 10.0.0.77)"},
		{"not what the hook gave", rec, true, "a", []string{"127.0.0.1"}, "the pre-start hook gave the kubelet 10.0.0.77"},
		{"pinned loopback", isolation.HookRecord{Slot: "a", NodeIP: "127.0.0.1", Pinned: true}, true, "a", []string{"127.0.0.1"}, ""},
		{"kubelet's own pick", isolation.HookRecord{Slot: "a"}, true, "a", []string{"10.0.0.77"}, ""},
	} {
		got := nodeAddrProblem(c.rec, c.found, c.slot, c.internal)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}

func TestDecideNodeAddrReported(t *testing.T) {
	in := base(t)
	in.NodeAddrErr = "the Node reports InternalIP 10.0.0.5, which this host no longer has"
	if got := strings.Join(summary(Decide(in)), "; "); got != "report Degraded Degraded/"+ReasonNodeAddress {
		t.Errorf("got %q", got)
	}
}
