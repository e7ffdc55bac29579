package reset

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/hostprep"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/stagekit"
	"github.com/kubeslot/kubeslot/lib/systemdconn/sdtest"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/units"
)

// newFakeSystemd is a host systemd whose machines are the nspawn units'
// slots: stopping systemd-nspawn@S.service removes machine S.
func newFakeSystemd() *sdtest.Systemd {
	sd := sdtest.New(func(unit string) string {
		if slot, ok := strings.CutPrefix(unit, "systemd-nspawn@"); ok {
			return strings.TrimSuffix(slot, ".service")
		}
		return ""
	})
	sd.Fail = map[string]error{}
	return sd
}

// machineRunning tells whether slot's machine is registered.
func machineRunning(h *host, slot string) bool {
	_, err := h.sd.Machine(context.Background(), slot)
	return err == nil
}

// fakeSys is a hostprep.System with installed packages in memory.
type fakeSys struct {
	mu          sync.Mutex
	packages    map[string]bool
	removed     []string
	podNetworks []string // links whose pod network was removed
	// failPodNetwork fails RemovePodNetwork.
	failPodNetwork error
}

func (s *fakeSys) PackageInstalled(ctx context.Context, name string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.packages[name], nil
}
func (s *fakeSys) InstallPackages(ctx context.Context, names ...string) error {
	return fmt.Errorf("unexpected install")
}
func (s *fakeSys) RemovePackages(ctx context.Context, names ...string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range names {
		delete(s.packages, n)
		s.removed = append(s.removed, n)
	}
	return nil
}
func (s *fakeSys) Module(name string) (hostprep.ModuleState, error) {
	return hostprep.ModuleAbsent, nil
}
func (s *fakeSys) LoadModule(ctx context.Context, name string) error { return nil }
func (s *fakeSys) ReadSysctl(key string) (string, error)             { return "", fs.ErrNotExist }
func (s *fakeSys) WriteSysctl(key, value string) error               { return nil }
func (s *fakeSys) ActiveSwaps() ([]hostprep.Swap, error)             { return nil, nil }
func (s *fakeSys) SwapOff(ctx context.Context, dev string) error     { return nil }
func (s *fakeSys) SwapOn(ctx context.Context, dev string, p int) error {
	return nil
}
func (s *fakeSys) RemovePodNetwork(ctx context.Context, link string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failPodNetwork != nil {
		return s.failPodNetwork
	}
	s.podNetworks = append(s.podNetworks, link)
	return nil
}

// host is a temporary root laid out like a bootstrapped host, with foreign
// files next to kubeslot's.
type host struct {
	t    *testing.T
	root *hostroot.Root
	rec  *ownership.Record
	sd   *sdtest.Systemd
	sys  *fakeSys
	self string
}

// Paths a bootstrapped host has that a reset must remove.
var kubeslotPaths = []string{
	"/opt/kubeslot",
	"/etc/sysctl.d/90-kubeslot.conf",
	"/etc/systemd/nspawn/a.nspawn",
	"/etc/systemd/system/systemd-nspawn@a.service.d/kubeslot.conf",
	"/etc/systemd/system/machines.target.wants/systemd-nspawn@a.service",
	"/etc/systemd/system/multi-user.target.wants/machines.target",
	"/var/lib/machines/a",
	"/etc/systemd/system/kubeslot-watcher.service",
	"/etc/systemd/system/kubeslot-resetting.service",
	"/etc/systemd/system/multi-user.target.wants/kubeslot-resetting.service",
	"/etc/systemd/system/multi-user.target.wants/kubeslot-watcher.service",
	"/etc/systemd/system/kubeslot-reset.path",
	"/etc/systemd/system/multi-user.target.wants/kubeslot-reset.path",
	"/etc/systemd/system/kubeslot-bootstrap.service",
	"/etc/systemd/system/multi-user.target.wants/kubeslot-bootstrap.service",
	"/etc/systemd/system/kubeslot-repave@.service",
}

// Foreign paths that must stay, with their content.
var foreignFiles = map[string]string{
	"/etc/systemd/nspawn/foreign.nspawn":                           "[Exec]\nBoot=yes\n",
	"/etc/systemd/system/foreign.service":                          "[Service]\nExecStart=/bin/true\n",
	"/etc/systemd/system/systemd-nspawn@a.service.d/operator.conf": "[Service]\nNice=1\n",
	"/etc/sysctl.d/99-foreign.conf":                                "vm.swappiness = 1\n",
	"/var/lib/machines/other/etc/os-release":                       "ID=other\n",
}

// operatorToken is the join token in operatorConfig, the configuration
// Ignition laid down (0600): a reset keeps the file without the token.
const operatorToken = "abcdef.0123456789abcdef"

const operatorConfig = "# the operator's, with a comment\n[machine]\nname = \"m1\"\n\n[cluster]\nserver = \"https://203.0.113.10:6443\"\n" +
	"bootstrap_token = \"" + operatorToken + "\"   # rotated weekly\nca_file = \"/etc/kubeslot/ca.crt\"\n"

func newHost(t *testing.T) *host {
	t.Helper()
	root := testkit.Root(t)
	h := &host{t: t, root: root, sd: newFakeSystemd(), sys: &fakeSys{packages: map[string]bool{"systemd-container": true}}}
	// The running resetter the resetting unit gets a copy of.
	h.self = filepath.Join(t.TempDir(), "kubeslot-resetter")
	if err := os.WriteFile(h.self, []byte("#!/bin/sh\n# the resetter\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Before kubeslot: the host's own files, and what Ignition laid down.
	for p, c := range foreignFiles {
		h.write(p, c)
	}
	h.write(units.ConfigPath, operatorConfig)
	if err := os.Chmod(h.local(units.ConfigPath), 0o600); err != nil {
		t.Fatal(err)
	}
	h.write("/etc/modules-load.d/kubeslot.conf", "# the admin's own\nloop\n")
	h.write("/etc/systemd/system/custom.service", "[Service]\nExecStart=/bin/false\n")
	if err := root.EnsureLayout(); err != nil {
		t.Fatal(err)
	}
	h.write("/opt/kubeslot/releases/blue/kubeslot-resetter", "binary")
	h.link("/opt/kubeslot/current", "releases/blue")
	bs, err := units.Render(units.Bootstrap, units.Vars{})
	if err != nil {
		t.Fatal(err)
	}
	h.write("/etc/systemd/system/"+units.Bootstrap, string(bs))
	h.link("/etc/systemd/system/multi-user.target.wants/"+units.Bootstrap, "/etc/systemd/system/"+units.Bootstrap)

	// The bootstrap: record, then each change journalled before it is made
	// (saved at the end).
	if h.rec, err = ownership.New("m1", "abcdef", "test"); err != nil {
		t.Fatal(err)
	}
	h.rec.SetCheckpoint(ownership.CheckpointComplete)
	h.journal(ownership.KindPackage, "systemd-container", func() {})
	h.journal(ownership.KindPodNetwork, "cni0", func() {})
	h.journal(ownership.KindModuleFile, "/etc/modules-load.d/kubeslot.conf", func() { h.write("/etc/modules-load.d/kubeslot.conf", "overlay\n") })
	h.journal(ownership.KindSysctlFile, "/etc/sysctl.d/90-kubeslot.conf", func() { h.write("/etc/sysctl.d/90-kubeslot.conf", "net.ipv4.ip_forward = 1\n") })
	for _, p := range []string{"/var/lib/machines/.a.partial", "/var/lib/machines/a"} {
		h.journal(ownership.KindMachineRootfs, p, func() {})
	}
	h.write("/var/lib/machines/a/etc/os-release", "ID=debian\n")
	h.journal(ownership.KindNspawnSettings, "/etc/systemd/nspawn/a.nspawn", func() { h.write("/etc/systemd/nspawn/a.nspawn", "[Exec]\n") })
	h.journal(ownership.KindDir, "/etc/systemd/system/systemd-nspawn@a.service.d", func() { h.mkdir("/etc/systemd/system/systemd-nspawn@a.service.d") })
	h.journal(ownership.KindUnit, "/etc/systemd/system/systemd-nspawn@a.service.d/kubeslot.conf", func() {
		h.write("/etc/systemd/system/systemd-nspawn@a.service.d/kubeslot.conf", "[Service]\n")
	})
	h.journal(ownership.KindDir, "/etc/systemd/system/machines.target.wants", func() { h.mkdir("/etc/systemd/system/machines.target.wants") })
	h.journal(ownership.KindUnit, "/etc/systemd/system/machines.target.wants/systemd-nspawn@a.service", func() {
		h.link("/etc/systemd/system/machines.target.wants/systemd-nspawn@a.service", "/lib/systemd/system/systemd-nspawn@.service")
	})
	h.journal(ownership.KindUnit, "/etc/systemd/system/multi-user.target.wants/machines.target", func() {
		h.link("/etc/systemd/system/multi-user.target.wants/machines.target", "/lib/systemd/system/machines.target")
	})
	all, err := units.All(units.Vars{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range units.Names() {
		if n == units.Bootstrap {
			continue // laid down by Ignition, identical: never journalled
		}
		p := "/etc/systemd/system/" + n
		h.journal(ownership.KindUnit, p, func() { h.write(p, string(all[n])) })
		for _, l := range installLinks(n, all[n]) {
			if strings.Contains(n, "@.") {
				continue
			}
			h.journal(ownership.KindUnit, l, func() { h.link(l, p) })
		}
	}
	// A unit kubeslot replaced: its prior content comes back.
	h.journal(ownership.KindUnit, "/etc/systemd/system/custom.service", func() { h.write("/etc/systemd/system/custom.service", "kubeslot's\n") })
	h.write("/opt/kubeslot/applied/a.json", "{}")
	if err := ownership.Save(root, h.rec); err != nil {
		t.Fatal(err)
	}
	h.sd.Units[units.Watcher] = "active"
	h.sd.Units[units.PathUnit("reset")] = "active"
	h.sd.Units[units.Bootstrap] = "active"
	h.sd.Units["systemd-nspawn@a.service"] = "active"
	h.sd.Machines["a"] = hostapi.Machine{Name: "a", State: "running", Leader: 42}
	return h
}

func (h *host) local(p string) string {
	l, err := localEntry(h.root, p)
	if err != nil {
		h.t.Fatal(err)
	}
	return l
}

func (h *host) write(p, content string) {
	h.t.Helper()
	l := h.local(p)
	if err := os.MkdirAll(filepath.Dir(l), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(l, []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

func (h *host) mkdir(p string) {
	h.t.Helper()
	if err := os.MkdirAll(h.local(p), 0o755); err != nil {
		h.t.Fatal(err)
	}
}

func (h *host) link(p, target string) {
	h.t.Helper()
	l := h.local(p)
	if err := os.MkdirAll(filepath.Dir(l), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Symlink(target, l); err != nil {
		h.t.Fatal(err)
	}
}

func (h *host) journal(kind ownership.Kind, target string, change func()) {
	h.t.Helper()
	c := ownership.Change{Kind: kind}
	if kind.UsesName() {
		c.Name, c.Prior.State = target, ownership.PriorAbsent
	} else {
		prior, err := ownership.CapturePrior(h.root, target)
		if err != nil {
			h.t.Fatal(err)
		}
		c.Path, c.Prior = target, prior
	}
	// Journalled in memory, saved once by newHost: what a bootstrap
	// leaves, without a synced save per change.
	c.At = time.Now().UTC().Round(0)
	h.rec.Journal = append(h.rec.Journal, c)
	h.rec.UpdatedAt = c.At
	change()
}

func (h *host) exists(p string) bool {
	_, err := os.Lstat(h.local(p))
	return err == nil
}

func (h *host) read(p string) string {
	b, err := os.ReadFile(h.local(p))
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

// readLocal reads a file outside the host root (the test's own).
func (h *host) readLocal(p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

func (h *host) deps() Deps {
	return Deps{Root: h.root, Begin: (&stagekit.Driver{Root: h.root}).Begin, Systemd: h.sd, Sys: h.sys, LockWait: 2e9, PublishWait: 2e9, StopWait: 2e9, Self: h.self}
}

// tree snapshots every path under the prefix (except the volatile lock
// under /run) with its type, mode and content digest, a line each, sorted.
func (h *host) tree() string {
	h.t.Helper()
	var lines []string
	for rel, v := range testkit.Tree(h.t, h.root.Prefix()) {
		if rel == "run" || strings.HasPrefix(rel, "run/") {
			continue
		}
		lines = append(lines, path.Join("/", rel)+" "+v)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

func hostRootWithBase(h *host, base string) (*hostroot.Root, error) {
	return hostroot.New(h.root.Prefix(), base)
}
