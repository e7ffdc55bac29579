package nspawn

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

// configured is a test host with slot a provisioned and configured, as a node start finds it.
func configured(t *testing.T) *env {
	t.Helper()
	e := newEnv(t)
	b := e.backend(nil)
	if err := b.Provision(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if err := b.Configure(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) hookDeps(addr string) HookDeps {
	return HookDeps{Root: e.root, Record: e.rec, AddrWait: 300 * time.Millisecond,
		NodeAddr: func() (netip.Addr, error) {
			if addr == "" {
				return netip.Addr{}, errors.New("no default route")
			}
			return netip.MustParseAddr(addr), nil
		}}
}

func (e *env) node(p string) string { return e.read("/var/lib/machines/a" + p) }

func TestPreStartFollowsTheHost(t *testing.T) {
	e := configured(t)
	settings := e.read("/etc/systemd/nspawn/a.nspawn")
	dropIn := e.read("/etc/systemd/system/systemd-nspawn@a.service.d/kubeslot.conf")
	if !strings.Contains(dropIn, "ExecStartPre=/bin/sh -c ") || !strings.Contains(dropIn, " /opt/kubeslot/current/kubeslot /opt/kubeslot %i\n") {
		t.Errorf("the drop-in does not run the hook:\n%s", dropIn)
	}
	if !strings.Contains(settings, "ResolvConf=off\n") || !strings.HasSuffix(settings, hostBlockMarker+"\n") {
		t.Errorf("settings:\n%s", settings)
	}
	e.put("/etc/resolv.conf", []byte("nameserver 192.0.2.53\nsearch example.org\n"))

	// First start: the host has the address 10.0.0.5, no modules, no kvm.
	rec, err := PreStart(t.Context(), e.hookDeps("10.0.0.5"), "a")
	if err != nil {
		t.Fatal(err)
	}
	if rec.NodeIP != "10.0.0.5" || rec.Pinned || rec.Resolv != "/etc/resolv.conf" {
		t.Errorf("record %+v", rec)
	}
	if s := e.node(nodeconfig.NodeIPDropIn); !strings.Contains(s, "Environment="+nodeconfig.NodeIPEnv+"=--node-ip=10.0.0.5\n") {
		t.Errorf("node IP drop-in:\n%s", s)
	}
	if s := e.node("/etc/resolv.conf"); !strings.Contains(s, "nameserver 192.0.2.53\n") {
		t.Errorf("node resolv.conf:\n%s", s)
	}
	if got := e.read("/etc/systemd/nspawn/a.nspawn"); got != settings {
		t.Errorf("settings changed with nothing new on the host:\n%s", got)
	}
	if saved, found, err := LoadHookRecord(e.root); err != nil || !found || saved.NodeIP != "10.0.0.5" {
		t.Errorf("hook record %+v %v %v", saved, found, err)
	}

	// The host changed across a reboot: a new address, modules, a resolved stub.
	if err := os.MkdirAll(filepath.Join(e.root.Prefix(), "lib/modules"), 0o755); err != nil {
		t.Fatal(err)
	}
	e.put("/etc/resolv.conf", []byte("nameserver 127.0.0.53\noptions edns0\n"))
	e.put("/run/systemd/resolve/resolv.conf", []byte("nameserver 198.51.100.1\n"))
	journal := len(e.rec.Journal)
	if _, err := PreStart(t.Context(), e.hookDeps("10.0.0.77"), "a"); err != nil {
		t.Fatal(err)
	}
	if s := e.node(nodeconfig.NodeIPDropIn); !strings.Contains(s, "--node-ip=10.0.0.77\n") {
		t.Errorf("node IP drop-in after the change:\n%s", s)
	}
	if s := e.node("/etc/resolv.conf"); !strings.Contains(s, "nameserver 198.51.100.1\n") || strings.Contains(s, "127.0.0.53") {
		t.Errorf("node resolv.conf from a stub host:\n%s", s)
	}
	got := e.read("/etc/systemd/nspawn/a.nspawn")
	if !strings.HasSuffix(got, hostBlockMarker+"\nBindReadOnly=/lib/modules\n") || !strings.HasPrefix(got, strings.TrimSuffix(settings, hostBlockMarker+"\n")) {
		t.Errorf("settings after the host got modules:\n%s", got)
	}
	if len(e.rec.Journal) != journal {
		t.Errorf("the hook journalled: %d entries, had %d (it must only rewrite journalled files)", len(e.rec.Journal), journal)
	}
	// Configure renders the same host part: nothing to rewrite.
	if err := e.backend(nil).Configure(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if again := e.read("/etc/systemd/nspawn/a.nspawn"); again != got {
		t.Errorf("configure and the hook disagree:\n%s\n---\n%s", got, again)
	}
}

func TestPreStartPinnedAndNoAddress(t *testing.T) {
	e := configured(t)
	d := e.hookDeps("10.0.0.5")
	d.Settings = hostapi.Settings{NodeIP: "127.0.0.1"}
	rec, err := PreStart(t.Context(), d, "a")
	if err != nil {
		t.Fatal(err)
	}
	if !rec.Pinned || rec.NodeIP != "127.0.0.1" {
		t.Errorf("pinned: record %+v", rec)
	}
	if s := e.node(nodeconfig.NodeIPDropIn); !strings.Contains(s, "Environment="+nodeconfig.NodeIPEnv+"=\n") {
		t.Errorf("pinned: drop-in must leave the unit's --node-ip alone:\n%s", s)
	}
	// No address within the wait: the kubelet picks one, the node still starts; no resolv.conf on the host.
	t0 := time.Now()
	rec, err = PreStart(t.Context(), e.hookDeps(""), "a")
	if err != nil {
		t.Fatal(err)
	}
	if rec.NodeIP != "" || time.Since(t0) > 5*time.Second {
		t.Errorf("no address: record %+v after %v", rec, time.Since(t0))
	}
	if s := e.node(nodeconfig.NodeIPDropIn); !strings.Contains(s, "Environment="+nodeconfig.NodeIPEnv+"=\n") {
		t.Errorf("no address:\n%s", s)
	}
	if s := e.node("/etc/resolv.conf"); strings.Contains(s, "nameserver") {
		t.Errorf("resolv.conf without a host file:\n%s", s)
	}
	// Loopback is no node address.
	if rec, _ := PreStart(t.Context(), e.hookDeps("127.0.0.1"), "a"); rec.NodeIP != "" {
		t.Errorf("loopback taken as node address: %+v", rec)
	}
}

func TestPreStartFailurePolicy(t *testing.T) {
	e := configured(t)
	if _, err := PreStart(t.Context(), e.hookDeps("10.0.0.5"), "../a"); err == nil || errors.Is(err, ErrHookStale) {
		t.Errorf("bad slot: %v", err)
	}
	if _, err := PreStart(t.Context(), e.hookDeps("10.0.0.5"), "b"); err == nil || errors.Is(err, ErrHookStale) {
		t.Errorf("a slot without a rootfs cannot run the hook, and is not stale: %v", err)
	}
	// A host part to rewrite but no record: not rewritten, the node still starts.
	if err := os.MkdirAll(filepath.Join(e.root.Prefix(), "lib/modules"), 0o755); err != nil {
		t.Fatal(err)
	}
	d := e.hookDeps("10.0.0.5")
	d.Record = &ownership.Record{}
	if _, err := PreStart(t.Context(), d, "a"); err != nil {
		t.Errorf("unjournalled settings: %v", err)
	}
	if s := e.read("/etc/systemd/nspawn/a.nspawn"); strings.Contains(s, "/lib/modules") {
		t.Errorf("rewrote a file the journal does not name:\n%s", s)
	}
	// Settings gone: nspawn would start the node without them: stale, the start fails.
	if err := os.Remove(filepath.Join(e.root.Prefix(), "etc/systemd/nspawn/a.nspawn")); err != nil {
		t.Fatal(err)
	}
	if _, err := PreStart(t.Context(), e.hookDeps("10.0.0.5"), "a"); !errors.Is(err, ErrHookStale) {
		t.Errorf("missing settings: %v, want ErrHookStale", err)
	}
}

func TestResolvConfChoice(t *testing.T) {
	for _, c := range []struct {
		in   string
		loop bool
	}{
		{"nameserver 127.0.0.53\n", true}, {"nameserver ::1\nnameserver 127.0.0.1\n", true},
		{"nameserver 127.0.0.53\nnameserver 192.0.2.1\n", false}, {"# none\n", false}, {"nameserver fe80::1%eth0\n", false},
	} {
		if got := onlyLoopback([]byte(c.in)); got != c.loop {
			t.Errorf("onlyLoopback(%q) = %v", c.in, got)
		}
	}
}
