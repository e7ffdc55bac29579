package hostprep

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

func undoAll(t *testing.T, root *hostroot.Root, f *fakeSys, rec *ownership.Record) {
	t.Helper()
	for _, c := range rec.Changes() {
		if !Handles(c.Kind) {
			t.Fatalf("Handles(%s) = false for a kind Apply recorded", c.Kind)
		}
		if err := Undo(context.Background(), root, f, c, nil); err != nil {
			t.Fatalf("Undo %s %s%s: %v", c.Kind, c.Path, c.Name, err)
		}
	}
}

func TestUndoRestoresFreshHost(t *testing.T) {
	root, rec := testHost(t)
	f := freshFake(t, root)
	before := snapshot(t, root)
	if err := Apply(context.Background(), root, f, rec, DefaultRequirements(true), nil); err != nil {
		t.Fatal(err)
	}
	f.checkJournal = false
	applied := len(f.mutatingCalls())
	undoAll(t, root, f, rec)
	undoCalls := f.mutatingCalls()[applied:]
	wantCalls := []string{
		"swapon /dev/vdb 5",
		"sysctl net.bridge.bridge-nf-call-ip6tables=0",
		"sysctl net.bridge.bridge-nf-call-iptables=0",
		"sysctl net.ipv4.ip_forward=0",
		"remove systemd-container",
	}
	if !slices.Equal(undoCalls, wantCalls) {
		t.Errorf("undo calls:\n got  %q\n want %q", undoCalls, wantCalls)
	}
	// Files and the directory kubeslot made are gone; only the record
	// differs from before.
	after := snapshot(t, root)
	rp := strings.TrimPrefix(root.HostPath(hostroot.OwnershipFile), "/") // snapshot's paths are relative
	delete(before, rp)
	delete(after, rp)
	assertSameTree(t, before, after)
	if f.installed["systemd-container"] || f.sysctls["net.ipv4.ip_forward"] != "0" || len(f.swaps) != 1 {
		t.Errorf("fake state after undo: installed=%v sysctls=%v swaps=%v", f.installed, f.sysctls, f.swaps)
	}

	// Undo again: everything is undone already, nothing is called.
	undoAll(t, root, f, rec)
	if got := f.mutatingCalls(); len(got) != applied+len(wantCalls) {
		t.Errorf("second undo made calls: %q", got[applied+len(wantCalls):])
	}
}

func TestUndoRestoresForeignSysctlFile(t *testing.T) {
	root, rec := testHost(t)
	f := freshFake(t, root)
	mkdir(t, root, hostroot.SysctlDir)
	const foreign = "# the admin's\nvm.swappiness = 10\n"
	writeHostFile(t, root, SysctlFile, foreign, 0o600)
	if err := Apply(context.Background(), root, f, rec, DefaultRequirements(true), nil); err != nil {
		t.Fatal(err)
	}
	f.assertNoProblems()
	c, ok := rec.Lookup(ownership.KindSysctlFile, SysctlFile)
	if !ok || c.Prior.State != ownership.PriorFile || string(c.Prior.Content) != foreign || c.Prior.Mode != 0o600 {
		t.Fatalf("prior of the foreign file: %+v", c.Prior)
	}
	if got := readFile(t, root, SysctlFile, 0o644); got == foreign {
		t.Fatal("foreign file not replaced")
	}
	// Someone changes ip_forward after kubeslot: theirs stays on undo. A
	// foreign file lands in the directory kubeslot did not make: stays.
	f.sysctls["net.ipv4.ip_forward"] = "7"
	if err := Undo(context.Background(), root, f, c, nil); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, root, SysctlFile, 0o600); got != foreign {
		t.Errorf("restored content %q, want %q", got, foreign)
	}
	if f.sysctls["net.bridge.bridge-nf-call-iptables"] != "0" {
		t.Errorf("bridge key not restored: %v", f.sysctls)
	}
	if f.sysctls["net.ipv4.ip_forward"] != "7" || slices.Contains(f.mutatingCalls(), "sysctl net.ipv4.ip_forward=0") {
		t.Error("ip_forward was written although it no longer held kubeslot's value")
	}
}

func TestUndoLeavesDirectoryWithForeignFiles(t *testing.T) {
	root, rec := testHost(t)
	f := freshFake(t, root)
	if err := Apply(context.Background(), root, f, rec, Requirements{Sysctls: map[string]string{"net.ipv4.ip_forward": "1"}}, nil); err != nil {
		t.Fatal(err)
	}
	writeHostFile(t, root, hostroot.SysctlDir+"/10-foreign.conf", "x = 1\n", 0o644)
	undoAll(t, root, f, rec)
	if _, err := os.Stat(local(t, root, SysctlFile)); !os.IsNotExist(err) {
		t.Errorf("kubeslot's sysctl file: %v", err)
	}
	if _, err := os.Stat(local(t, root, hostroot.SysctlDir+"/10-foreign.conf")); err != nil {
		t.Errorf("foreign file: %v", err)
	}
}

func TestUndoEdgeCases(t *testing.T) {
	root, _ := testHost(t)
	f := newFake(t, root)
	f.checkJournal = false
	ctx := context.Background()

	// A package that was there before kubeslot is never removed.
	if err := Undo(ctx, root, f, ownership.Change{Kind: ownership.KindPackage, Name: "dpkg", Prior: ownership.Prior{State: ownership.PriorPresent}}, nil); err != nil {
		t.Fatal(err)
	}
	// A package kubeslot installed that is gone already: success.
	if err := Undo(ctx, root, f, ownership.Change{Kind: ownership.KindPackage, Name: "systemd-container", Prior: ownership.Prior{State: ownership.PriorAbsent}}, nil); err != nil {
		t.Fatal(err)
	}
	// A swap file deleted since: success, no swapon.
	if err := Undo(ctx, root, f, ownership.Change{Kind: ownership.KindSwapOff, Path: "/swapfile", Prior: ownership.Prior{State: ownership.PriorPresent, Value: `{"type":"file","priority":-2}`}}, nil); err != nil {
		t.Fatal(err)
	}
	// A swap area on already (fstab, after a reboot): success, no swapon.
	f.swaps = []Swap{{Path: "/dev/vdb", Type: "partition", Priority: -2}}
	if err := Undo(ctx, root, f, ownership.Change{Kind: ownership.KindSwapOff, Path: "/dev/vdb", Prior: ownership.Prior{State: ownership.PriorPresent}}, nil); err != nil {
		t.Fatal(err)
	}
	// Files and a directory already gone, the directory's parent too.
	for _, c := range []ownership.Change{
		{Kind: ownership.KindSysctlFile, Path: "/nonexistent/90-kubeslot.conf", Prior: ownership.Prior{State: ownership.PriorAbsent, Value: `{"net.ipv4.ip_forward":{"prior":"0","set":"1"}}`}},
		{Kind: ownership.KindModuleFile, Path: ModulesFile, Prior: ownership.Prior{State: ownership.PriorAbsent}},
		{Kind: ownership.KindDir, Path: "/nonexistent/dir", Prior: ownership.Prior{State: ownership.PriorAbsent}},
	} {
		if err := Undo(ctx, root, f, c, nil); err != nil {
			t.Errorf("Undo %s %s: %v", c.Kind, c.Path, err)
		}
	}
	if c := f.mutatingCalls(); len(c) != 0 {
		t.Errorf("calls: %v", c)
	}
	// Kinds hostprep does not make are refused, not ignored.
	err := Undo(ctx, root, f, ownership.Change{Kind: ownership.KindUnit, Path: "/etc/systemd/system/x.service", Prior: ownership.Prior{State: ownership.PriorAbsent}}, nil)
	if err == nil || !strings.Contains(err.Error(), "x.service") || Handles(ownership.KindUnit) {
		t.Errorf("Undo of a unit: %v", err)
	}
	// A damaged sysctl value is an error naming the file.
	err = Undo(ctx, root, f, ownership.Change{Kind: ownership.KindSysctlFile, Path: SysctlFile, Prior: ownership.Prior{State: ownership.PriorAbsent, Value: "{"}}, nil)
	if err == nil || !strings.Contains(err.Error(), SysctlFile) {
		t.Errorf("damaged value: %v", err)
	}
}
