package hostprep

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

func findStep(t *testing.T, p *Plan, kind ownership.Kind, target string) Step {
	t.Helper()
	for _, s := range p.Steps {
		if s.Kind == kind && s.Target == target {
			return s
		}
	}
	t.Fatalf("no %s %s step in plan:\n%s", kind, target, p)
	return Step{}
}

func TestPreflightReportsAndChangesNothing(t *testing.T) {
	root, _ := testHost(t)
	f := freshFake(t, root)
	before := snapshot(t, root)

	plan, err := Preflight(context.Background(), root, f, DefaultRequirements(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("plan:\n%s", plan)
	assertSameTree(t, before, snapshot(t, root))
	if c := f.mutatingCalls(); len(c) != 0 {
		t.Errorf("Preflight made calls: %v", c)
	}

	pkg := findStep(t, plan, ownership.KindPackage, "systemd-container")
	if !pkg.Needed || !strings.Contains(pkg.Blocked, "host.install_packages") {
		t.Errorf("missing package with install disallowed: %+v", pkg)
	}
	if err := plan.Err(); err == nil || !strings.Contains(err.Error(), "systemd-container") || !strings.Contains(err.Error(), "host.install_packages") {
		t.Errorf("Err() = %v, want the package and the config key named", err)
	}
	if s := findStep(t, plan, ownership.KindDir, hostroot.SysctlDir); !s.Needed {
		t.Errorf("sysctl dir: %+v", s)
	}
	if s := findStep(t, plan, ownership.KindSysctlFile, SysctlFile); !s.Needed || s.Blocked != "" {
		t.Errorf("sysctl file: %+v", s)
	}
	if s := findStep(t, plan, ownership.KindModuleFile, ModulesFile); !s.Needed {
		t.Errorf("module file: %+v", s)
	}
	if s := findStep(t, plan, KindModuleLoad, "br_netfilter"); !s.Needed {
		t.Errorf("br_netfilter: %+v", s)
	}
	if s := findStep(t, plan, KindModuleLoad, "overlay"); s.Needed || !strings.Contains(s.Action, "built into") {
		t.Errorf("overlay: %+v", s)
	}
	// The bridge keys do not exist before br_netfilter loads: not blocked.
	if s := findStep(t, plan, KindSysctlValue, "net.bridge.bridge-nf-call-iptables"); !s.Needed || s.Blocked != "" || !strings.Contains(s.Action, "br_netfilter") {
		t.Errorf("bridge sysctl: %+v", s)
	}
	if s := findStep(t, plan, KindSysctlValue, "net.ipv4.ip_forward"); !s.Needed || !strings.Contains(s.Action, "now 0") {
		t.Errorf("ip_forward: %+v", s)
	}
	if s := findStep(t, plan, ownership.KindSwapOff, "/dev/vdb"); !s.Needed || s.Blocked != "" {
		t.Errorf("swap: %+v", s)
	}
	if len(plan.Blocked()) != 1 {
		t.Errorf("blocked steps: %+v", plan.Blocked())
	}

	// With installing allowed, the same host is not blocked.
	plan, err = Preflight(context.Background(), root, f, DefaultRequirements(true))
	if err != nil {
		t.Fatal(err)
	}
	if err := plan.Err(); err != nil {
		t.Errorf("install allowed: %v", err)
	}
	if len(plan.Changes()) != 9 { // package, dir, 2 files, load, 3 sysctls, swap
		t.Errorf("changes: %d, want 9:\n%s", len(plan.Changes()), plan)
	}
	assertSameTree(t, before, snapshot(t, root))
	if c := f.mutatingCalls(); len(c) != 0 {
		t.Errorf("Preflight made calls: %v", c)
	}
}

func TestApplyFreshHost(t *testing.T) {
	root, rec := testHost(t)
	f := freshFake(t, root)
	if err := Apply(context.Background(), root, f, rec, DefaultRequirements(true), nil); err != nil {
		t.Fatal(err)
	}
	f.assertNoProblems()

	wantCalls := []string{
		"install systemd-container",
		"modprobe br_netfilter",
		"sysctl net.bridge.bridge-nf-call-ip6tables=1",
		"sysctl net.bridge.bridge-nf-call-iptables=1",
		"sysctl net.ipv4.ip_forward=1",
		"swapoff /dev/vdb",
	}
	if got := f.mutatingCalls(); !slices.Equal(got, wantCalls) {
		t.Errorf("calls:\n got  %q\n want %q", got, wantCalls)
	}

	sysctl := readFile(t, root, SysctlFile, 0o644)
	if want := "\nnet.bridge.bridge-nf-call-ip6tables = 1\nnet.bridge.bridge-nf-call-iptables = 1\nnet.ipv4.ip_forward = 1\n"; !strings.HasSuffix(sysctl, want) {
		t.Errorf("%s:\n%s\nwant it to end with the sorted keys", SysctlFile, sysctl)
	}
	mods := readFile(t, root, ModulesFile, 0o644)
	if !strings.HasSuffix(mods, "\nbr_netfilter\n") || strings.Contains(mods, "\noverlay\n") {
		t.Errorf("%s lists loadable modules only (overlay is built in):\n%s", ModulesFile, mods)
	}
	if fi, err := os.Stat(local(t, root, hostroot.SysctlDir)); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("%s: %v %v", hostroot.SysctlDir, fi, err)
	}

	disk, err := ownership.Load(root)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, c := range disk.Journal {
		kinds = append(kinds, string(c.Kind)+" "+c.Path+c.Name)
	}
	wantKinds := []string{
		"package systemd-container",
		"dir " + hostroot.SysctlDir,
		"module-file " + ModulesFile,
		"sysctl-file " + SysctlFile,
		"swap-off /dev/vdb",
	}
	if !slices.Equal(kinds, wantKinds) {
		t.Errorf("journal:\n got  %q\n want %q", kinds, wantKinds)
	}
	sc, _ := disk.Lookup(ownership.KindSysctlFile, SysctlFile)
	if sc.Prior.State != ownership.PriorAbsent {
		t.Errorf("sysctl file prior: %+v", sc.Prior)
	}
	var vals map[string]sysctlChange
	if err := json.Unmarshal([]byte(sc.Prior.Value), &vals); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"net.bridge.bridge-nf-call-ip6tables", "net.bridge.bridge-nf-call-iptables", "net.ipv4.ip_forward"} {
		if vals[k] != (sysctlChange{Prior: "0", Set: "1"}) {
			t.Errorf("journalled runtime value of %s: %+v", k, vals[k])
		}
	}
	sw, _ := disk.Lookup(ownership.KindSwapOff, "/dev/vdb")
	if sw.Prior.State != ownership.PriorPresent || !strings.Contains(sw.Prior.Value, `"priority":5`) {
		t.Errorf("swap entry: %+v", sw.Prior)
	}
}

func TestApplySecondRunIsNoop(t *testing.T) {
	root, rec := testHost(t)
	f := freshFake(t, root)
	if err := Apply(context.Background(), root, f, rec, DefaultRequirements(true), nil); err != nil {
		t.Fatal(err)
	}
	first := len(f.mutatingCalls())
	before := snapshot(t, root)
	if err := Apply(context.Background(), root, f, rec, DefaultRequirements(true), nil); err != nil {
		t.Fatal(err)
	}
	if got := f.mutatingCalls(); len(got) != first {
		t.Errorf("second Apply made calls: %q", got[first:])
	}
	assertSameTree(t, before, snapshot(t, root)) // includes ownership.json: no new entries
	plan, err := Preflight(context.Background(), root, f, DefaultRequirements(false))
	if err != nil {
		t.Fatal(err)
	}
	if c := plan.Changes(); len(c) != 0 || plan.Err() != nil {
		t.Errorf("prepared host still has changes: %+v, %v", c, plan.Err())
	}
}

func TestApplyBlockedChangesNothing(t *testing.T) {
	root, rec := testHost(t)
	f := freshFake(t, root)
	before := snapshot(t, root)
	err := Apply(context.Background(), root, f, rec, DefaultRequirements(false), nil)
	if err == nil || !strings.Contains(err.Error(), "systemd-container") || !strings.Contains(err.Error(), "host.install_packages") {
		t.Fatalf("Apply = %v, want an error naming the package and host.install_packages", err)
	}
	t.Logf("error: %v", err)
	assertSameTree(t, before, snapshot(t, root))
	if c := f.mutatingCalls(); len(c) != 0 {
		t.Errorf("blocked Apply made calls: %v", c)
	}
	if len(rec.Journal) != 0 {
		t.Errorf("blocked Apply journalled: %+v", rec.Journal)
	}
}

func TestApplyRefusesSymlinkedFile(t *testing.T) {
	root, rec := testHost(t)
	f := freshFake(t, root)
	mkdir(t, root, hostroot.SysctlDir)
	writeHostFile(t, root, "/etc/host-sysctl.conf", "vm.swappiness = 10\n", 0o644)
	if err := os.Symlink("/etc/host-sysctl.conf", local(t, root, SysctlFile)); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, root)
	err := Apply(context.Background(), root, f, rec, DefaultRequirements(true), nil)
	if err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("Apply = %v, want a refusal to write through the link", err)
	}
	assertSameTree(t, before, snapshot(t, root))
	if c := f.mutatingCalls(); len(c) != 0 {
		t.Errorf("calls: %v", c)
	}
}

// A journal that cannot be written stops the change it was for: proof that
// each entry is persisted before its change, for the file writes too.
func TestApplyJournalFailureStopsChange(t *testing.T) {
	cases := map[string]Requirements{
		"package":     {Software: []Software{SystemdContainer}, InstallPackages: true},
		"module file": {Modules: []string{"br_netfilter"}},
		"sysctl file": {Sysctls: map[string]string{"net.ipv4.ip_forward": "1"}},
		"swap":        {SwapOff: true},
	}
	for name, req := range cases {
		t.Run(name, func(t *testing.T) {
			root, rec := testHost(t)
			mkdir(t, root, hostroot.SysctlDir)
			f := freshFake(t, root)
			f.checkJournal = false
			// The record becomes unwritable: a directory where the file was.
			rp := local(t, root, root.HostPath(hostroot.OwnershipFile))
			if err := os.Remove(rp); err != nil {
				t.Fatal(err)
			}
			mkdir(t, root, root.HostPath(hostroot.OwnershipFile))
			before := snapshot(t, root)
			err := Apply(context.Background(), root, f, rec, req, nil)
			if err == nil {
				t.Fatal("Apply succeeded without a journal")
			}
			t.Logf("error: %v", err)
			assertSameTree(t, before, snapshot(t, root))
			if c := f.mutatingCalls(); len(c) != 0 {
				t.Errorf("changes made without a journal entry: %v", c)
			}
		})
	}
}

func TestRequirementsValidate(t *testing.T) {
	if err := DefaultRequirements(false).Validate(); err != nil {
		t.Fatal(err)
	}
	bad := map[string]Requirements{
		`package "-oAPT::x"`:     {Software: []Software{{Name: "x", Commands: []string{"x"}, Apt: "-oAPT::x", DNF: "x"}}},
		`"Bad"`:                  {Software: []Software{{Name: "x", Commands: []string{"x"}, Apt: "Bad", DNF: "x"}}},
		`package "-x"`:           {Software: []Software{{Name: "x", Commands: []string{"x"}, Apt: "xx", DNF: "-x"}}},
		`command "../x"`:         {Software: []Software{{Name: "x", Commands: []string{"../x"}, Apt: "xx", DNF: "x"}}},
		`software "x": listed`:   {Software: []Software{SystemdContainer, {Name: "x", Commands: []string{"a"}, Apt: "aa", DNF: "a"}, {Name: "x", Commands: []string{"b"}, Apt: "bb", DNF: "b"}}},
		`listed twice`:           {Modules: []string{"br_netfilter", "br-netfilter"}},
		`module "../x"`:          {Modules: []string{"../x"}},
		`key "ip_forward"`:       {Sysctls: map[string]string{"ip_forward": "1"}},
		`segment ""`:             {Sysctls: map[string]string{"net...x": "1"}},
		`value "1\n2"`:           {Sysctls: map[string]string{"net.ipv4.ip_forward": "1\n2"}},
		`net.ipv4.ip_forward: v`: {Sysctls: map[string]string{"net.ipv4.ip_forward": " "}},
	}
	for want, req := range bad {
		err := req.Validate()
		if err == nil {
			t.Errorf("%+v accepted", req)
			continue
		}
		first := strings.SplitN(want, ":", 2)[0]
		if !strings.Contains(err.Error(), first) {
			t.Errorf("%+v: %v, want it to contain %q", req, err, first)
		}
	}
	root, rec := testHost(t)
	f := freshFake(t, root)
	if err := Apply(context.Background(), root, f, rec, bad[`"Bad"`], nil); err == nil {
		t.Error("Apply accepted an invalid package name")
	}
}

func TestSwapDeletedWhileInUseBlocks(t *testing.T) {
	root, _ := testHost(t)
	f := newFake(t, root)
	f.swaps = []Swap{{Path: "/swapfile (deleted)", Type: "file", Priority: -2}}
	plan, err := Preflight(context.Background(), root, f, Requirements{SwapOff: true})
	if err != nil {
		t.Fatal(err)
	}
	if s := findStep(t, plan, ownership.KindSwapOff, "/swapfile (deleted)"); !strings.Contains(s.Blocked, "deleted") {
		t.Errorf("deleted swap file: %+v", s)
	}
}

func TestSysctlKeyMissingWithoutModuleBlocks(t *testing.T) {
	root, _ := testHost(t)
	f := newFake(t, root) // no modules to load, no keys
	plan, err := Preflight(context.Background(), root, f, Requirements{Sysctls: map[string]string{"net.bridge.bridge-nf-call-iptables": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if s := findStep(t, plan, KindSysctlValue, "net.bridge.bridge-nf-call-iptables"); !strings.Contains(s.Blocked, "/proc/sys/net/bridge/bridge-nf-call-iptables") {
		t.Errorf("missing key: %+v", s)
	}
}

func readFile(t *testing.T, root *hostroot.Root, hostPath string, mode os.FileMode) string {
	t.Helper()
	p := local(t, root, hostPath)
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode() != mode {
		t.Errorf("%s: mode %v, want %v", hostPath, fi.Mode(), mode)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
