package sdhost

import (
	"context"
	"net/netip"
	"testing"
)

func TestHostNodeNetworkOptionsAreChecked(t *testing.T) {
	for _, o := range []Options{
		{Name: "ok", NodeNetwork: true, SharedNetwork: true},
		{Name: "ok", NodeIP: netip.MustParseAddr("10.213.9.2")},
		{Name: "ok", NodeNetwork: true, NodeIP: netip.MustParseAddr("8.8.8.8")},
		{Name: "ok", NodeNetwork: true, NodeIP: netip.MustParseAddr("10.213.9.1")},
		{Name: "ok", NodeNetwork: true, NodeIP: netip.MustParseAddr("fd00::2")},
	} {
		if _, err := Start(context.Background(), o); err == nil {
			t.Errorf("Start(%+v) accepted bad options", o)
		}
	}
}

func TestHostNodeIPsAreDistinct(t *testing.T) {
	a := &Host{opts: Options{Name: "a", NodeNetwork: true}}
	b := &Host{opts: Options{Name: "b", NodeNetwork: true}}
	c := &Host{opts: Options{Name: "c", NodeNetwork: true, NodeIP: netip.MustParseAddr("10.213.200.2")}}
	d := &Host{opts: Options{Name: "d", NodeNetwork: true, NodeIP: netip.MustParseAddr("10.213.200.2")}}
	for _, h := range []*Host{a, b, c} {
		if err := h.claimNodeIP(); err != nil {
			t.Fatal(err)
		}
		defer h.releaseNodeIP()
	}
	if a.NodeIP() == b.NodeIP() || !NodeIPPrefix.Contains(a.NodeIP()) || !NodeIPPrefix.Contains(b.NodeIP()) {
		t.Errorf("node IPs %v and %v", a.NodeIP(), b.NodeIP())
	}
	if c.NodeIP().String() != "10.213.200.2" {
		t.Errorf("explicit node IP: got %v", c.NodeIP())
	}
	if err := d.claimNodeIP(); err == nil {
		t.Error("two hosts got 10.213.200.2")
	}
	a.releaseNodeIP()
	e := &Host{opts: Options{Name: "e", NodeNetwork: true}}
	if err := e.claimNodeIP(); err != nil {
		t.Fatal(err)
	}
	defer e.releaseNodeIP()
	if e.NodeIP() != a.NodeIP() {
		t.Errorf("released %v not reused: got %v", a.NodeIP(), e.NodeIP())
	}
}

func TestSetNodeIP(t *testing.T) {
	h := &Host{opts: Options{Name: "s", NodeNetwork: true}}
	o := &Host{opts: Options{Name: "o", NodeNetwork: true, NodeIP: netip.MustParseAddr("10.213.201.2")}}
	for _, x := range []*Host{h, o} {
		if err := x.claimNodeIP(); err != nil {
			t.Fatal(err)
		}
		defer x.releaseNodeIP()
	}
	old := h.NodeIP()
	if err := h.SetNodeIP(o.NodeIP()); err == nil {
		t.Error("took another host's address")
	}
	if err := h.SetNodeIP(netip.MustParseAddr("8.8.8.8")); err == nil {
		t.Error("took a public address")
	}
	next := netip.MustParseAddr("10.213.202.2")
	if err := h.SetNodeIP(next); err != nil || h.NodeIP() != next {
		t.Fatalf("SetNodeIP: %v, now %v", err, h.NodeIP())
	}
	// The old address is free again.
	f := &Host{opts: Options{Name: "f", NodeNetwork: true, NodeIP: old}}
	if err := f.claimNodeIP(); err != nil {
		t.Errorf("old address not released: %v", err)
	}
	f.releaseNodeIP()
}
