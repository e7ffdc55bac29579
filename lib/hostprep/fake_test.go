package hostprep

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kubeslot/kubeslot/lib/hostprep/distrotest"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
)

// fakeSys is a System over in-memory state. Every mutating call is logged in
// calls and, while checkJournal is set, checks on disk (ownership.Load) that
// its journal entry was persisted before the call: that is the ordering
// Apply promises.
type fakeSys struct {
	t            *testing.T
	root         *hostroot.Root
	checkJournal bool
	// strictPackages: a host where no package tool may be asked; any
	// package call fails the test.
	strictPackages bool

	mu        sync.Mutex
	installed map[string]bool
	modules   map[string]ModuleState
	sysctls   map[string]string
	appear    map[string]map[string]string // module → sysctl keys its load creates
	swaps     []Swap
	calls     []string
	problems  []string
}

func newFake(t *testing.T, root *hostroot.Root) *fakeSys {
	return &fakeSys{
		t: t, root: root, checkJournal: true,
		installed: map[string]bool{"dpkg": true},
		modules:   map[string]ModuleState{},
		sysctls:   map[string]string{},
		appear:    map[string]map[string]string{},
	}
}

func (f *fakeSys) call(format string, args ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

// journalled checks the entry for kind/target is on disk now.
func (f *fakeSys) journalled(what string, kind ownership.Kind, target string) (ownership.Change, bool) {
	if !f.checkJournal {
		return ownership.Change{}, true
	}
	rec, err := ownership.Load(f.root)
	if err != nil || rec == nil {
		f.problems = append(f.problems, fmt.Sprintf("%s: no record on disk (%v)", what, err))
		return ownership.Change{}, false
	}
	c, ok := rec.Lookup(kind, target)
	if !ok {
		f.problems = append(f.problems, fmt.Sprintf("%s: no %s %s entry on disk at call time", what, kind, target))
	}
	return c, ok
}

func (f *fakeSys) mutatingCalls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func (f *fakeSys) PackageInstalled(_ context.Context, name string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.strictPackages {
		f.t.Errorf("package tool asked about %s on a host where kubeslot runs none", name)
	}
	return f.installed[name], nil
}

func (f *fakeSys) InstallPackages(_ context.Context, names ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.call("install %s", strings.Join(names, " "))
	if f.strictPackages {
		f.t.Errorf("install %v on a host where kubeslot runs no package tool", names)
	}
	for _, n := range names {
		if c, ok := f.journalled("install "+n, ownership.KindPackage, n); ok && f.checkJournal && c.Prior.State != ownership.PriorAbsent {
			f.problems = append(f.problems, "install "+n+": journalled with prior "+string(c.Prior.State))
		}
		f.installed[n] = true
	}
	return nil
}

func (f *fakeSys) RemovePackages(_ context.Context, names ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.call("remove %s", strings.Join(names, " "))
	for _, n := range names {
		delete(f.installed, n)
	}
	return nil
}

func (f *fakeSys) Module(name string) (ModuleState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.modules[name], nil
}

func (f *fakeSys) LoadModule(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.call("modprobe %s", name)
	// Persisted before loaded: the module file is journalled and on disk.
	if _, ok := f.journalled("modprobe "+name, ownership.KindModuleFile, ModulesFile); ok && f.checkJournal {
		local, _ := f.root.Resolve(ModulesFile)
		if b, err := os.ReadFile(local); err != nil || !strings.Contains(string(b), "\n"+name+"\n") {
			f.problems = append(f.problems, fmt.Sprintf("modprobe %s: %s does not list it yet (%v)", name, ModulesFile, err))
		}
	}
	f.modules[name] = ModuleLoaded
	for k, v := range f.appear[name] {
		if _, ok := f.sysctls[k]; !ok {
			f.sysctls[k] = v
		}
	}
	return nil
}

func (f *fakeSys) ReadSysctl(key string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.sysctls[key]
	if !ok {
		return "", fmt.Errorf("sysctl %s: %w", key, fs.ErrNotExist)
	}
	return v, nil
}

func (f *fakeSys) WriteSysctl(key, value string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.call("sysctl %s=%s", key, value)
	if c, ok := f.journalled("sysctl "+key, ownership.KindSysctlFile, SysctlFile); ok && f.checkJournal {
		var m map[string]sysctlChange
		if err := json.Unmarshal([]byte(c.Prior.Value), &m); err != nil || m[key].Set != value {
			f.problems = append(f.problems, fmt.Sprintf("sysctl %s=%s: journal value %q does not hold it", key, value, c.Prior.Value))
		}
	}
	if _, ok := f.sysctls[key]; !ok {
		return fmt.Errorf("sysctl %s: %w", key, fs.ErrNotExist)
	}
	f.sysctls[key] = value
	return nil
}

func (f *fakeSys) ActiveSwaps() ([]Swap, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.swaps), nil
}

func (f *fakeSys) SwapOff(_ context.Context, dev string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.call("swapoff %s", dev)
	f.journalled("swapoff "+dev, ownership.KindSwapOff, dev)
	f.swaps = slices.DeleteFunc(f.swaps, func(s Swap) bool { return s.Path == dev })
	return nil
}

func (f *fakeSys) SwapOn(_ context.Context, dev string, priority int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.call("swapon %s %d", dev, priority)
	f.swaps = append(f.swaps, Swap{Path: dev, Type: "partition", Priority: priority})
	return nil
}

func (f *fakeSys) RemovePodNetwork(_ context.Context, link string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.call("remove pod network %s", link)
	return nil
}

// assertNoProblems fails the test with every ordering violation seen.
func (f *fakeSys) assertNoProblems() {
	f.t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.problems {
		f.t.Errorf("journal ordering: %s", p)
	}
}

// testHost is a temp root with kubeslot's layout, an ownership record and
// /etc/modules-load.d but no /etc/sysctl.d, like a minimal host.
func testHost(t *testing.T) (*hostroot.Root, *ownership.Record) {
	t.Helper()
	root := testkit.LaidOut(t)
	debianHost(t, root)
	mkdir(t, root, hostroot.ModulesDir)
	mkdir(t, root, "/dev")
	writeHostFile(t, root, "/dev/vdb", "swap area", 0o600)
	return root, testhost.Owned(t, root, "node-1", "abc123")
}

// debianHost makes root a Debian 12 host to DetectDistro: its os-release
// and the apt tools (stand-ins: the fake System runs nothing).
func debianHost(t *testing.T, root *hostroot.Root) {
	t.Helper()
	mkdir(t, root, "/usr/lib")
	writeHostFile(t, root, OSReleaseFileUsr, distrotest.Debian12, 0o644)
	mkdir(t, root, "/usr/bin")
	for _, c := range []string{"dpkg-query", "apt-get"} {
		writeHostFile(t, root, "/usr/bin/"+c, "#!/bin/sh\nexit 1\n", 0o755)
	}
}

// freshFake is a host that needs everything: systemd-container missing,
// overlay built in, br_netfilter absent (its bridge keys appear at load, as
// 0), ip_forward 0, one swap partition on.
func freshFake(t *testing.T, root *hostroot.Root) *fakeSys {
	f := newFake(t, root)
	f.modules["overlay"] = ModuleBuiltin
	f.appear["br_netfilter"] = map[string]string{
		"net.bridge.bridge-nf-call-iptables":  "0",
		"net.bridge.bridge-nf-call-ip6tables": "0",
	}
	f.sysctls["net.ipv4.ip_forward"] = "0"
	f.swaps = []Swap{{Path: "/dev/vdb", Type: "partition", Priority: 5}}
	return f
}

func local(t *testing.T, root *hostroot.Root, hostPath string) string {
	t.Helper()
	p, err := root.Resolve(hostPath)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mkdir(t *testing.T, root *hostroot.Root, hostPath string) {
	t.Helper()
	if err := os.MkdirAll(local(t, root, hostPath), 0o755); err != nil {
		t.Fatal(err)
	}
}

func writeHostFile(t *testing.T, root *hostroot.Root, hostPath, content string, mode fs.FileMode) {
	t.Helper()
	p := local(t, root, hostPath)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// snapshot describes every entry under the prefix: type, mode, content
// digest or link target.
func snapshot(t *testing.T, root *hostroot.Root) map[string]string {
	t.Helper()
	return testkit.Tree(t, root.Prefix())
}

func assertSameTree(t *testing.T, before, after map[string]string) {
	t.Helper()
	if d := testkit.TreeDiff(before, after); d != "" {
		t.Errorf("the tree changed:\n%s", d)
	}
}
