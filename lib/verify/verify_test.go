package verify_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/release"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/unitinstall"
	"github.com/kubeslot/kubeslot/lib/verify"
	"github.com/kubeslot/kubeslot/lib/verify/verifytest"
)

var year = time.Now().Add(365 * 24 * time.Hour)

func run(t *testing.T, root *hostroot.Root, sd verify.Systemd) *verify.Report {
	t.Helper()
	return verify.Run(context.Background(), verify.Deps{Root: root, Systemd: sd, ConfigFile: verify.DefaultConfigFile})
}

// check returns the named check of rep.
func check(t *testing.T, rep *verify.Report, name string) verify.Result {
	t.Helper()
	for _, c := range rep.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %s in %+v", name, rep.Checks)
	return verify.Result{}
}

// wantFinding fails unless check name is a problem with a finding on file
// and field (file compared by suffix), and the report's exit code is 3.
func wantFinding(t *testing.T, rep *verify.Report, name, file, field string) verify.Finding {
	t.Helper()
	c := check(t, rep, name)
	if c.Status != verify.Problem {
		t.Fatalf("%s: %s (%s), want problem", name, c.Status, c.Detail)
	}
	if rep.ExitCode() != verify.ExitProblems || rep.Verdict != verify.VerdictProblems {
		t.Errorf("verdict %s exit %d, want %s %d", rep.Verdict, rep.ExitCode(), verify.VerdictProblems, verify.ExitProblems)
	}
	for _, f := range c.Findings {
		if strings.HasSuffix(f.File, file) && f.Field == field {
			return f
		}
	}
	t.Fatalf("%s: no finding on %s %s in %+v", name, file, field, c.Findings)
	return verify.Finding{}
}

// onlyProblem fails unless name is the only check with a problem.
func onlyProblem(t *testing.T, rep *verify.Report, name string) {
	t.Helper()
	for _, c := range rep.Checks {
		if c.Name != name && c.Status == verify.Problem {
			t.Errorf("%s: problem too: %+v", c.Name, c.Findings)
		}
	}
}

func TestHealthyIsOKAndChangesNothing(t *testing.T) {
	root := verifytest.Healthy(t, year)
	prefix := root.Prefix()
	before := testkit.Tree(t, prefix)
	rep := run(t, root, verifytest.NewSystemd())
	after := testkit.Tree(t, prefix)
	if d := testkit.TreeDiff(before, after); d != "" {
		t.Errorf("verify changed the host root:\n%s", d)
	}
	if rep.Verdict != verify.VerdictOK || rep.ExitCode() != 0 {
		t.Fatalf("verdict %s exit %d: %+v", rep.Verdict, rep.ExitCode(), rep)
	}
	names := []string{verify.CheckInstallation, verify.CheckApplied, verify.CheckCurrent, verify.CheckLastGood,
		verify.CheckUnitFiles, verify.CheckUnitsState, verify.CheckMachine, verify.CheckIdentity, verify.CheckConfig}
	if len(rep.Checks) != len(names) {
		t.Fatalf("%d checks, want %d: %+v", len(rep.Checks), len(names), rep.Checks)
	}
	for i, n := range names {
		if c := rep.Checks[i]; c.Name != n || c.Status != verify.OK || c.Detail == "" {
			t.Errorf("check %d: %+v, want %s ok with a detail", i, c, n)
		}
	}
	if d := check(t, rep, verify.CheckIdentity).Detail; !strings.Contains(d, "system:node:worker-1") || !strings.Contains(d, "(in 87") {
		t.Errorf("identity detail %q: want the subject and the time left", d)
	}
	if d := check(t, rep, verify.CheckCurrent).Detail; !strings.Contains(d, "green") || !strings.Contains(d, "sha256") {
		t.Errorf("current detail %q", d)
	}
}

func TestEditedUnitFile(t *testing.T) {
	root := verifytest.Healthy(t, year)
	p, err := root.Unit("kubeslot-watcher.service")
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(p)
	if err := os.WriteFile(p, append(data, "# edited\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	rep := run(t, root, verifytest.NewSystemd())
	f := wantFinding(t, rep, verify.CheckUnitFiles, "/etc/systemd/system/kubeslot-watcher.service", "content")
	if !strings.Contains(f.Value, `"# edited"`) || !strings.Contains(f.Want, "releases/green/units") {
		t.Errorf("finding %+v: want the differing line and where the rendering came from", f)
	}
	onlyProblem(t, rep, verify.CheckUnitFiles)
}

func TestUnitFileModeLinkAndStray(t *testing.T) {
	root := verifytest.Healthy(t, year)
	p, _ := root.Unit("kubeslot-repave.path")
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	link, _ := unitinstall.LocalEntry(root, "/etc/systemd/system/multi-user.target.wants/kubeslot-watcher.service")
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	stray, _ := root.Unit("kubeslot-old.service")
	if err := os.WriteFile(stray, []byte("[Unit]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rep := run(t, root, verifytest.NewSystemd())
	wantFinding(t, rep, verify.CheckUnitFiles, "kubeslot-repave.path", "mode")
	wantFinding(t, rep, verify.CheckUnitFiles, "multi-user.target.wants/kubeslot-watcher.service", "target")
	wantFinding(t, rep, verify.CheckUnitFiles, "kubeslot-old.service", "presence")
}

func TestCurrentPointsNowhere(t *testing.T) {
	root := verifytest.Healthy(t, year)
	dir, _ := release.Dir(root, "green")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	rep := run(t, root, verifytest.NewSystemd())
	f := wantFinding(t, rep, verify.CheckCurrent, "/opt/kubeslot/current", "target")
	if !strings.Contains(f.Value, "releases/green points nowhere") {
		t.Errorf("finding %+v", f)
	}
	// Without a current release there is nothing to render the units from.
	if c := check(t, rep, verify.CheckUnitFiles); c.Status != verify.Skipped {
		t.Errorf("unit-files: %+v, want skipped", c)
	}
	if c := check(t, rep, verify.CheckLastGood); c.Status != verify.OK {
		t.Errorf("last-good: %+v", c)
	}
}

func TestLastGoodNotARelease(t *testing.T) {
	root := verifytest.Healthy(t, year)
	base, _ := root.Path()
	lg := filepath.Join(base, hostroot.LastGoodLink)
	if err := os.Remove(lg); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/tmp/elsewhere", lg); err != nil {
		t.Fatal(err)
	}
	rep := run(t, root, verifytest.NewSystemd())
	wantFinding(t, rep, verify.CheckLastGood, "/opt/kubeslot/last-good", "target")
	onlyProblem(t, rep, verify.CheckLastGood)

	// No link at all: the bootstrap sets it at installation (and its
	// boot-time run repairs it), so a complete host without one has no
	// release to fall back to.
	if err := os.Remove(lg); err != nil {
		t.Fatal(err)
	}
	rep = run(t, root, verifytest.NewSystemd())
	f := wantFinding(t, rep, verify.CheckLastGood, "/opt/kubeslot/last-good", "presence")
	if f.Value != "missing" || !strings.Contains(f.Want, "fall back") {
		t.Errorf("no last-good: %+v", f)
	}
}

func TestManifestMismatch(t *testing.T) {
	root := verifytest.Healthy(t, year)
	dir, _ := release.Dir(root, "blue")
	// Same size, other bytes: only the sha256 tells.
	p := filepath.Join(dir, "kubeslot-watcher")
	data, _ := os.ReadFile(p)
	data[len(data)-2] = 'X'
	if err := os.WriteFile(p, data, 0o755); err != nil {
		t.Fatal(err)
	}
	rep := run(t, root, verifytest.NewSystemd())
	f := wantFinding(t, rep, verify.CheckLastGood, "/opt/kubeslot/releases/blue/kubeslot-watcher", "sha256")
	if len(f.Value) != 64 || len(f.Want) != 64 || f.Value == f.Want {
		t.Errorf("finding %+v: want both sums", f)
	}
	onlyProblem(t, rep, verify.CheckLastGood)

	// A file the manifest does not list.
	if err := os.WriteFile(filepath.Join(dir, "extra"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("#!/bin/sh\necho kubeslot-watcher\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	f = wantFinding(t, run(t, root, verifytest.NewSystemd()), verify.CheckLastGood, "/opt/kubeslot/releases/blue", "manifest")
	if !strings.Contains(f.Value, "extra") {
		t.Errorf("finding %+v: want the unlisted file named", f)
	}
}

func TestReleaseWithoutManifest(t *testing.T) {
	root := verifytest.Healthy(t, year)
	dir := verifytest.Release(t, root, "blue", false)
	os.Remove(filepath.Join(dir, "manifest.json"))
	rep := run(t, root, verifytest.NewSystemd())
	c := check(t, rep, verify.CheckLastGood)
	if c.Status != verify.OK || !strings.Contains(c.Detail, "Ignition") {
		t.Fatalf("last-good: %+v, want ok saying the sums cannot be checked", c)
	}
	if err := os.Remove(filepath.Join(dir, "kubeslot-repaver")); err != nil {
		t.Fatal(err)
	}
	wantFinding(t, run(t, root, verifytest.NewSystemd()), verify.CheckLastGood, "releases/blue/kubeslot-repaver", "presence")
}

func TestAppliedChecksum(t *testing.T) {
	root := verifytest.Healthy(t, year)
	p, _ := root.File(hostroot.AppliedDir, "a.json")
	data, _ := os.ReadFile(p)
	if err := os.WriteFile(p, append(data, ' '), 0o600); err != nil {
		t.Fatal(err)
	}
	rep := run(t, root, verifytest.NewSystemd())
	f := wantFinding(t, rep, verify.CheckApplied, "/opt/kubeslot/applied/a.json", "sha256")
	if !strings.Contains(f.Value, "mismatch") {
		t.Errorf("finding %+v", f)
	}
	// The machine check needs the active slot's configuration.
	if c := check(t, rep, verify.CheckMachine); c.Status != verify.Skipped {
		t.Errorf("machine: %+v, want skipped", c)
	}
}

func TestExpiredCertificate(t *testing.T) {
	root := verifytest.Healthy(t, year)
	verifytest.Identity(t, root, time.Now().Add(-48*time.Hour), time.Now().Add(-90*time.Minute))
	rep := run(t, root, verifytest.NewSystemd())
	f := wantFinding(t, rep, verify.CheckIdentity, "/opt/kubeslot/identity/kubelet-client-current.pem", "notAfter")
	if !strings.Contains(f.Value, "expired 1h30m0s ago") {
		t.Errorf("finding %+v", f)
	}
	onlyProblem(t, rep, verify.CheckIdentity)
}

func TestNoIdentity(t *testing.T) {
	root := verifytest.Healthy(t, year)
	p, _ := root.Path(hostroot.IdentityDir, "kubelet-client-current.pem")
	os.Remove(p)
	wantFinding(t, run(t, root, verifytest.NewSystemd()), verify.CheckIdentity, "kubelet-client-current.pem", "presence")
}

func TestUnitsState(t *testing.T) {
	root := verifytest.Healthy(t, year)
	sd := verifytest.NewSystemd()
	sd.Active["kubeslot-watcher.service"] = "failed"
	sd.File["kubeslot-reset.path"] = "disabled"
	sd.Active["kubeslot-bootstrap.service"] = "inactive" // not failed: fine
	rep := run(t, root, sd)
	f := wantFinding(t, rep, verify.CheckUnitsState, "kubeslot-watcher.service", "ActiveState")
	if f.Value != "failed/dead" || f.Want != "active" {
		t.Errorf("finding %+v", f)
	}
	wantFinding(t, rep, verify.CheckUnitsState, "kubeslot-reset.path", "UnitFileState")
	if n := len(check(t, rep, verify.CheckUnitsState).Findings); n != 2 {
		t.Errorf("%d findings, want 2", n)
	}
}

func TestMachineNotRunning(t *testing.T) {
	root := verifytest.Healthy(t, year)
	sd := verifytest.NewSystemd()
	delete(sd.Machines, "a")
	sd.Active["systemd-nspawn@a.service"] = "inactive"
	rep := run(t, root, sd)
	wantFinding(t, rep, verify.CheckMachine, "systemd-nspawn@a.service", "ActiveState")
	wantFinding(t, rep, verify.CheckMachine, "machine a", "State")
	onlyProblem(t, rep, verify.CheckMachine)

	link, _ := root.Resolve("/etc/systemd/system/machines.target.wants")
	os.RemoveAll(link)
	wantFinding(t, run(t, root, verifytest.NewSystemd()), verify.CheckMachine, "machines.target.wants/systemd-nspawn@a.service", "target")
}

func TestSystemdUnreachableCannotVerify(t *testing.T) {
	root := verifytest.Healthy(t, year)
	sd := verifytest.NewSystemd()
	sd.Err = errors.New("dial unix /run/systemd/private: connection refused")
	rep := run(t, root, sd)
	if rep.Verdict != verify.VerdictCannotVerify || rep.ExitCode() != verify.ExitCannotVerify {
		t.Fatalf("verdict %s exit %d", rep.Verdict, rep.ExitCode())
	}
	for _, n := range []string{verify.CheckUnitsState, verify.CheckMachine} {
		if c := check(t, rep, n); c.Status != verify.Skipped || !strings.Contains(c.Detail, "connection refused") {
			t.Errorf("%s: %+v", n, c)
		}
	}
	// A problem elsewhere wins: it is known broken.
	verifytest.Identity(t, root, time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour))
	if rep := run(t, root, sd); rep.ExitCode() != verify.ExitProblems {
		t.Errorf("exit %d, want %d", rep.ExitCode(), verify.ExitProblems)
	}
	// Without systemd by choice, the rest still counts.
	rep = verify.Run(context.Background(), verify.Deps{Root: verifytest.Healthy(t, year), NoSystemd: "--no-systemd"})
	if rep.Verdict != verify.VerdictOK || check(t, rep, verify.CheckMachine).Detail != "--no-systemd" {
		t.Errorf("--no-systemd: %+v", rep)
	}
}

func TestNotInstalledOrIncomplete(t *testing.T) {
	rep := run(t, testkit.Root(t), verifytest.NewSystemd())
	if rep.ExitCode() != verify.ExitCannotVerify || !strings.Contains(rep.CannotVerify[0], "not installed") {
		t.Fatalf("empty root: %+v", rep)
	}
	for _, c := range rep.Checks[1:] {
		if c.Status != verify.Skipped {
			t.Errorf("%+v, want skipped", c)
		}
	}
	root := verifytest.Healthy(t, year)
	rec, err := ownership.Load(root)
	if err != nil {
		t.Fatal(err)
	}
	rec.Checkpoint = ownership.CheckpointStartingNode
	if err := ownership.Save(root, rec); err != nil {
		t.Fatal(err)
	}
	rep = run(t, root, verifytest.NewSystemd())
	if rep.ExitCode() != verify.ExitCannotVerify || !strings.Contains(rep.CannotVerify[0], "starting-node") {
		t.Errorf("incomplete: %+v", rep)
	}
	// A damaged record is a problem, not a reason to give up quietly.
	p, _ := ownership.RecordPath(root)
	if err := os.WriteFile(p, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	wantFinding(t, run(t, root, verifytest.NewSystemd()), verify.CheckInstallation, "/opt/kubeslot/ownership.json", "content")
}

// Planted FIFOs and links are named, never read through or waited on.
func TestHostileFilesNamedNotFollowed(t *testing.T) {
	root := verifytest.Healthy(t, year)
	unit, _ := root.Unit("kubeslot-watcher.service")
	os.Remove(unit)
	if err := syscall.Mkfifo(unit, 0o644); err != nil {
		t.Fatal(err)
	}
	other, _ := root.Unit("kubeslot-reset.path")
	os.Remove(other)
	if err := os.Symlink("/etc/shadow", other); err != nil {
		t.Fatal(err)
	}
	dir, _ := release.Dir(root, "green")
	bin := filepath.Join(dir, "kubeslot-repaver")
	os.Remove(bin)
	if err := syscall.Mkfifo(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	done := make(chan *verify.Report, 1)
	go func() { done <- run(t, root, verifytest.NewSystemd()) }()
	var rep *verify.Report
	select {
	case rep = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("verify hung on a FIFO")
	}
	wantFinding(t, rep, verify.CheckUnitFiles, "kubeslot-watcher.service", "type")
	wantFinding(t, rep, verify.CheckUnitFiles, "kubeslot-reset.path", "type")
	wantFinding(t, rep, verify.CheckCurrent, "releases/green/kubeslot-repaver", "type")
}
