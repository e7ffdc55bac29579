package hostprep

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

// These tests read this machine's real state through ExecSystem and change
// nothing: only dpkg-query, /proc and /sys reads.

func realSystem(t *testing.T) ExecSystem {
	t.Helper()
	root, err := hostroot.New("/", "")
	if err != nil {
		t.Fatal(err)
	}
	return ExecSystem{Root: root}
}

func TestExecSystemReadsThisMachine(t *testing.T) {
	s := realSystem(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	ok, err := s.PackageInstalled(ctx, "dpkg")
	if err != nil || !ok {
		t.Errorf("PackageInstalled(dpkg) = %v, %v; want true", ok, err)
	}
	ok, err = s.PackageInstalled(ctx, "kubeslot-no-such-package")
	if err != nil || ok {
		t.Errorf("PackageInstalled(unknown) = %v, %v; want false, nil", ok, err)
	}

	if fs, err := os.ReadFile("/proc/filesystems"); err == nil && strings.Contains(string(fs), "overlay") {
		st, err := s.Module("overlay")
		if err != nil || st == ModuleAbsent {
			t.Errorf("Module(overlay) = %v, %v, though /proc/filesystems lists overlay", st, err)
		}
		t.Logf("overlay: %v", st)
	}
	if st, err := s.Module("kubeslot_no_such_module"); err != nil || st != ModuleAbsent {
		t.Errorf("Module(unknown) = %v, %v", st, err)
	}

	swaps, err := s.ActiveSwaps()
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile("/proc/swaps")
	lines := len(strings.Split(strings.TrimSpace(string(raw)), "\n")) - 1
	if len(swaps) != lines {
		t.Errorf("ActiveSwaps = %+v, /proc/swaps has %d areas", swaps, lines)
	}
	t.Logf("swaps: %+v", swaps)

	v, err := s.ReadSysctl("net.ipv4.ip_forward")
	if err != nil || (v != "0" && v != "1") {
		t.Errorf("ReadSysctl(ip_forward) = %q, %v", v, err)
	}
	if _, err := s.ReadSysctl("kernel.kubeslot_no_such_key"); !isNotExist(err) {
		t.Errorf("ReadSysctl(unknown) = %v, want not-exist", err)
	}
}

// Preflight against this machine, for the record; it changes nothing.
func TestExecSystemPreflightThisMachine(t *testing.T) {
	s := realSystem(t)
	plan, err := Preflight(context.Background(), s.Root, s, DefaultRequirements(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("preflight of this machine:\n%s", plan)
}

func TestExecSystemRefusesPrefix(t *testing.T) {
	root := testkit.Root(t)
	s := ExecSystem{Root: root}
	ctx := context.Background()
	errs := map[string]error{}
	_, errs["PackageInstalled"] = s.PackageInstalled(ctx, "dpkg")
	errs["InstallPackages"] = s.InstallPackages(ctx, "x1")
	errs["RemovePackages"] = s.RemovePackages(ctx, "x1")
	_, errs["Module"] = s.Module("overlay")
	errs["LoadModule"] = s.LoadModule(ctx, "overlay")
	_, errs["ReadSysctl"] = s.ReadSysctl("net.ipv4.ip_forward")
	errs["WriteSysctl"] = s.WriteSysctl("net.ipv4.ip_forward", "1")
	_, errs["ActiveSwaps"] = s.ActiveSwaps()
	errs["SwapOff"] = s.SwapOff(ctx, "/dev/vdb")
	errs["SwapOn"] = s.SwapOn(ctx, "/dev/vdb", -1)
	for name, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "refusing") || !strings.Contains(err.Error(), root.Prefix()) {
			t.Errorf("%s under prefix %s: %v, want a refusal", name, root.Prefix(), err)
		}
	}
	if err := (ExecSystem{}).LoadModule(ctx, "overlay"); err == nil {
		t.Error("ExecSystem without a Root ran")
	}
	// Arguments that could be taken for options never reach a tool (the
	// validators the methods call first; not run against the real machine,
	// where a regression would exec "swapoff -a").
	if err := checkPackageNames([]string{"-oAPT::Get::x=1"}); err == nil || !strings.Contains(err.Error(), "not a Debian package name") {
		t.Errorf("option as package: %v", err)
	}
	if err := checkSwapPath("-a"); err == nil || !strings.Contains(err.Error(), "clean absolute path") {
		t.Errorf("option as swap area: %v", err)
	}
	if err := checkModuleName("-r"); err == nil {
		t.Error("option as module accepted")
	}
}

func TestParseSwaps(t *testing.T) {
	text := "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n" +
		"/dev/vdb                                partition\t2097148\t\t0\t\t-2\n" +
		"/var/swap\\040file                       file\t\t1048572\t\t512\t\t10\n"
	got, err := parseSwaps(text)
	if err != nil {
		t.Fatal(err)
	}
	want := []Swap{{"/dev/vdb", "partition", -2}, {"/var/swap file", "file", 10}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("parseSwaps = %+v, want %+v", got, want)
	}
	if got, err := parseSwaps("Filename Type Size Used Priority\n"); err != nil || len(got) != 0 {
		t.Errorf("empty table: %+v, %v", got, err)
	}
	if _, err := parseSwaps("Filename Type Size Used Priority\n/dev/x partition 1 0 high\n"); err == nil || !strings.Contains(err.Error(), "high") {
		t.Errorf("bad priority: %v", err)
	}
}

func TestRunReportsCommandAndOutputTail(t *testing.T) {
	_, err := run(context.Background(), time.Minute, nil, "sh", "-c", "echo FIRST_$((40+2)); head -c 5000 /dev/zero | tr '\\0' x; echo; echo the reason >&2; exit 3")
	if err == nil {
		t.Fatal("failing command succeeded")
	}
	msg := err.Error()
	t.Logf("error (%d bytes): %.200s…", len(msg), msg)
	if !strings.Contains(msg, "sh -c") || !strings.Contains(msg, "exit status 3") || !strings.Contains(msg, "the reason") {
		t.Errorf("error lacks the command, status or reason: %.300s", msg)
	}
	if strings.Contains(msg, "FIRST_42") || len(msg) > outputTail+500 {
		t.Errorf("output not cut to its tail (%d bytes)", len(msg))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = run(ctx, 0, nil, "sleep", "30")
	t.Logf("deadline stopped sleep after %v", time.Since(start))
	if err == nil || !strings.Contains(err.Error(), "deadline") || !strings.Contains(err.Error(), "sleep 30") {
		t.Errorf("bounded run: %v", err)
	}

	out, err := run(context.Background(), time.Minute, []string{"KUBESLOT_TEST_VAR=v1"}, "sh", "-c", "echo $KUBESLOT_TEST_VAR")
	if err != nil || strings.TrimSpace(string(out)) != "v1" {
		t.Errorf("stdout and env: %q, %v", out, err)
	}
}
