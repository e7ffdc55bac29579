package bootstrap

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/release"
	"github.com/kubeslot/kubeslot/lib/systemdconn/sdtest"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
	"github.com/kubeslot/kubeslot/lib/unitinstall"
	"github.com/kubeslot/kubeslot/lib/verify"
	"github.com/kubeslot/kubeslot/lib/verify/verifytest"
	"github.com/kubeslot/kubeslot/units"
)

var year = time.Now().Add(365 * 24 * time.Hour)

// linkSystemd is the fake systemd with the unit file state systemd would
// report: a unit is enabled when its enablement links were on disk at the
// last daemon-reload (or at the start), as a real systemd sees them.
type linkSystemd struct {
	*sdtest.Systemd
	root    *hostroot.Root
	enabled map[string]bool
}

func newLinkSystemd(t *testing.T, root *hostroot.Root) *linkSystemd {
	s := &linkSystemd{Systemd: sdtest.New(nil), root: root}
	for name, data := range mustUnits(t) {
		if enabled(name, data) && name != units.Bootstrap {
			s.Units[name] = "active"
		}
	}
	unit := isolation.ModeNspawn.MachineUnit("a")
	s.Units[unit] = "active"
	s.Machines["a"] = hostapi.Machine{Name: "a", State: "running", Leader: 4242, Class: "container", Service: unit}
	s.read()
	return s
}

func (s *linkSystemd) read() {
	s.enabled = map[string]bool{}
	for name, data := range mustUnits(nil) {
		ok := len(unitinstall.Links(name, data)) > 0
		for _, l := range unitinstall.Links(name, data) {
			local, err := unitinstall.LocalEntry(s.root, l)
			if err != nil {
				ok = false
				continue
			}
			if _, err := os.Readlink(local); err != nil {
				ok = false
			}
		}
		s.enabled[name] = ok
	}
}

func (s *linkSystemd) Reload(ctx context.Context) error {
	s.read()
	return s.Systemd.Reload(ctx)
}

func (s *linkSystemd) UnitFileState(_ context.Context, name string) (string, error) {
	if s.enabled[name] {
		return "enabled", nil
	}
	return "disabled", nil
}

// repairHost is a healthy installation (verifytest.Healthy) with the fakes
// around it, the run's log in a buffer, and the configuration it was
// installed with.
type repairHost struct {
	f   *fakes
	sd  *linkSystemd
	log *bytes.Buffer
	cfg *config.Config
}

func newRepairHost(t *testing.T, certNotAfter time.Time) *repairHost {
	f := newFakes(t)
	f.root = verifytest.Healthy(t, certNotAfter)
	h := &repairHost{f: f, sd: newLinkSystemd(t, f.root), log: &bytes.Buffer{}, cfg: testhost.Example(t)}
	// The lock's directory, as any earlier run leaves it, so that tree
	// comparisons see only what a repair does.
	must(t, os.MkdirAll(filepath.Join(f.root.Prefix(), "run/kubeslot"), 0o755))
	must(t, os.WriteFile(filepath.Join(f.root.Prefix(), "run/kubeslot/install.lock"), nil, 0o644))
	return h
}

func (h *repairHost) run(t *testing.T, cfg *config.Config) (*Result, error) {
	t.Helper()
	d := h.f.deps()
	d.Systemd = h.sd
	d.ConfigFile = "/etc/kubeslot/config.toml"
	d.Log = slog.New(slog.NewJSONHandler(h.log, nil))
	h.log.Reset()
	res, err := Run(t.Context(), d, cfg)
	t.Logf("bootstrap log:\n%s", h.log)
	return res, err
}

func (h *repairHost) verify(t *testing.T) *verify.Report {
	t.Helper()
	return verify.Run(t.Context(), verify.Deps{Root: h.f.root, Systemd: h.sd, ConfigFile: "/etc/kubeslot/config.toml"})
}

// lines are the log records with msg.
func (h *repairHost) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(h.log.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// wantLine fails unless a record with msg has check and a file ending in
// file (and field, when not "").
func (h *repairHost) wantLine(t *testing.T, msg, check, file, field string) map[string]any {
	t.Helper()
	for _, m := range h.lines(t, msg) {
		if m["check"] == check && strings.HasSuffix(m["file"].(string), file) && (field == "" || m["field"] == field) {
			return m
		}
	}
	t.Errorf("no %q line for %s %s %s", msg, check, file, field)
	return nil
}

func wantOK(t *testing.T, rep *verify.Report) {
	t.Helper()
	if rep.Verdict != verify.VerdictOK {
		for _, c := range rep.Checks {
			if c.Status != verify.OK {
				t.Errorf("%s %s: %s %v", c.Name, c.Status, c.Detail, c.Findings)
			}
		}
		t.Fatalf("verdict %s after the repair", rep.Verdict)
	}
}

func TestRepairHealthyChangesNothing(t *testing.T) {
	h := newRepairHost(t, year)
	wantOK(t, h.verify(t))
	// The first run over a host that joined with a token drops it from the
	// applied configuration (jointoken.go); healthy is what follows.
	if _, err := h.run(t, h.cfg); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, h.f.root.Prefix())
	res, err := h.run(t, h.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Decision != ownership.Complete || len(res.Repaired) != 0 || len(res.Started) != 0 {
		t.Errorf("result %+v", res)
	}
	if n := len(h.lines(t, "repaired")) + len(h.lines(t, "not repaired")); n != 0 {
		t.Errorf("%d repair lines on a healthy host", n)
	}
	if d := testkit.TreeDiff(before, snapshot(t, h.f.root.Prefix())); d != "" {
		t.Errorf("the run changed a healthy host:\n%s", d)
	}
	if h.sd.Reloads != 0 {
		t.Errorf("%d reloads", h.sd.Reloads)
	}
}

// Every repairable finding at once: each is repaired, logged, journalled,
// and verify is ok afterwards.
func TestRepairEachFindingThenVerifyOK(t *testing.T) {
	h := newRepairHost(t, year)
	root := h.f.root
	local := func(hostPath string) string {
		p, err := unitinstall.LocalEntry(root, hostPath)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	watcher := "/etc/systemd/system/kubeslot-watcher.service"
	data, _ := os.ReadFile(local(watcher))
	must(t, os.WriteFile(local(watcher), append(data, "# edited\n"...), 0o644))
	must(t, os.Chmod(local("/etc/systemd/system/kubeslot-repave.path"), 0o600))
	// Disabled as systemctl disable does: its link gone, systemd reloaded.
	must(t, os.Remove(local("/etc/systemd/system/multi-user.target.wants/kubeslot-upgrade.path")))
	h.sd.read()
	must(t, os.Remove(local("/etc/systemd/system/multi-user.target.wants/kubeslot-watcher.service")))
	h.sd.Units["kubeslot-watcher.service"] = "failed"
	// current spelled as an absolute path, last-good gone, boot link gone.
	base, _ := root.Path()
	must(t, os.Remove(filepath.Join(base, "current")))
	must(t, os.Symlink(filepath.Join(root.Base(), "releases/green"), filepath.Join(base, "current")))
	must(t, os.Remove(filepath.Join(base, "last-good")))
	boot := isolation.ModeNspawn.BootLink("a").Path
	must(t, os.Remove(local(boot)))
	h.sd.Units[isolation.ModeNspawn.MachineUnit("a")] = "inactive"

	rep := h.verify(t)
	if rep.ExitCode() != verify.ExitProblems {
		t.Fatalf("broken host: verdict %s", rep.Verdict)
	}
	res, err := h.run(t, h.cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.wantLine(t, "repaired", verify.CheckUnitFiles, "kubeslot-watcher.service", "content")
	h.wantLine(t, "repaired", verify.CheckUnitFiles, "kubeslot-repave.path", "mode")
	h.wantLine(t, "repaired", verify.CheckUnitFiles, "multi-user.target.wants/kubeslot-upgrade.path", "target")
	h.wantLine(t, "repaired", verify.CheckUnitFiles, "multi-user.target.wants/kubeslot-watcher.service", "target")
	h.wantLine(t, "repaired", verify.CheckUnitsState, "kubeslot-upgrade.path", "UnitFileState")
	h.wantLine(t, "repaired", verify.CheckUnitsState, "kubeslot-watcher.service", "ActiveState")
	h.wantLine(t, "repaired", verify.CheckCurrent, "/opt/kubeslot/current", "target")
	h.wantLine(t, "repaired", verify.CheckLastGood, "/opt/kubeslot/last-good", "presence")
	h.wantLine(t, "repaired", verify.CheckMachine, boot, "target")
	h.wantLine(t, "repaired", verify.CheckMachine, "systemd-nspawn@a.service", "ActiveState")
	if m := h.wantLine(t, "repaired", verify.CheckUnitFiles, "kubeslot-watcher.service", "content"); m != nil &&
		(!strings.Contains(m["was"].(string), `"# edited"`) || m["did"] == "") {
		t.Errorf("repair line %v: want what was wrong and what was done", m)
	}
	if n := len(h.lines(t, "not repaired")); n != 0 {
		t.Errorf("%d findings left", n)
	}
	if len(res.Repaired) == 0 || h.sd.Reloads != 1 {
		t.Errorf("repaired %v with %d reloads, want one reload", res.Repaired, h.sd.Reloads)
	}
	wantOK(t, h.verify(t))
	if name, _ := release.LastGood(root); name != "green" {
		t.Errorf("last-good names %q, want current's green", name)
	}
	// Every change outside the host root is in the journal, so reset
	// undoes it.
	rec, err := ownership.Load(root)
	must(t, err)
	for _, p := range []string{watcher, "/etc/systemd/system/multi-user.target.wants/kubeslot-upgrade.path", boot} {
		if _, ok := rec.Lookup(ownership.KindUnit, p); !ok {
			t.Errorf("%s not journalled", p)
		}
	}
	// And a second run has nothing left to do.
	if res, err := h.run(t, h.cfg); err != nil || len(res.Repaired) != 0 {
		t.Errorf("second run: %+v, %v", res, err)
	}
}

// What cannot be repaired is logged with its reason and left as it is;
// the run succeeds.
func TestRepairLeavesExpiredIdentityAndForeignUnit(t *testing.T) {
	h := newRepairHost(t, time.Now().Add(-time.Minute))
	stray, _ := h.f.root.Unit("kubeslot-mine.service")
	must(t, os.WriteFile(stray, []byte("[Unit]\n"), 0o644))
	before := snapshot(t, h.f.root.Prefix())
	if _, err := h.run(t, h.cfg); err != nil {
		t.Fatal(err)
	}
	if m := h.wantLine(t, "not repaired", verify.CheckIdentity, "kubelet-client-current.pem", "notAfter"); m != nil &&
		!strings.Contains(m["reason"].(string), "re-join") {
		t.Errorf("identity line %v: want the re-join named", m)
	}
	if m := h.wantLine(t, "not repaired", verify.CheckUnitFiles, "kubeslot-mine.service", "presence"); m != nil &&
		!strings.Contains(m["reason"].(string), "journal") {
		t.Errorf("stray unit line %v", m)
	}
	if d := testkit.TreeDiff(before, snapshot(t, h.f.root.Prefix())); d != "" {
		t.Errorf("the run changed what it left:\n%s", d)
	}
	rep := h.verify(t)
	for _, c := range rep.Checks {
		if c.Status == verify.Problem && c.Name != verify.CheckIdentity && c.Name != verify.CheckUnitFiles {
			t.Errorf("%s: %v", c.Name, c.Findings)
		}
	}
}

// A kubeslot unit file the current release does not have, which the
// journal says kubeslot made, is stopped and removed.
func TestRepairRemovesDroppedUnit(t *testing.T) {
	h := newRepairHost(t, year)
	rec, err := ownership.Load(h.f.root)
	must(t, err)
	_, err = unitinstall.WriteUnit(h.f.root, rec, "/etc/systemd/system/kubeslot-old.service", []byte("[Unit]\nDescription=old\n"))
	must(t, err)
	must(t, ownership.Save(h.f.root, rec))
	if _, err := h.run(t, h.cfg); err != nil {
		t.Fatal(err)
	}
	h.wantLine(t, "repaired", verify.CheckUnitFiles, "kubeslot-old.service", "presence")
	if !strings.Contains(strings.Join(h.sd.Calls(), ","), "stop kubeslot-old.service") {
		t.Errorf("calls %v: want the unit stopped first", h.sd.Calls())
	}
	wantOK(t, h.verify(t))
}

// An edited config.toml: a setting the Machine spec governs is warned
// about, naming the spec field, and the repair runs; a setting only a reset
// changes refuses the run, naming file, field and both values.
func TestEditedConfig(t *testing.T) {
	h := newRepairHost(t, year)
	parse := func(old, new string) *config.Config {
		s := strings.Replace(string(config.Example()), old, new, 1)
		c, err := config.Parse("/etc/kubeslot/config.toml", []byte(s))
		must(t, err)
		return c
	}
	res, err := h.run(t, parse(`"kubeslot.dev/pool" = "edge"`, `"kubeslot.dev/pool" = "core"`))
	if err != nil || res.Decision != ownership.Complete {
		t.Fatalf("node setting edited: %+v, %v", res, err)
	}
	w := h.lines(t, "configuration setting not applied: the Machine spec governs it after installation")
	if len(w) != 1 || w[0]["field"] != "kubernetes.labels.kubeslot.dev/pool" || w[0]["value"] != `"core"` ||
		!strings.Contains(w[0]["way_forward"].(string), "spec.node.labels of Machine worker-1") {
		t.Errorf("warnings %v", w)
	}

	before := snapshot(t, h.f.root.Prefix())
	_, err = h.run(t, parse(`server = "https://203.0.113.10:6443"`, `server = "https://203.0.113.99:6443"`))
	if err == nil {
		t.Fatal("an edited cluster.server was admitted")
	}
	for _, want := range []string{"/etc/kubeslot/config.toml", `cluster.server = "https://203.0.113.99:6443" (installed "https://203.0.113.10:6443")`, "reset the host"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if d := testkit.TreeDiff(before, snapshot(t, h.f.root.Prefix())); d != "" {
		t.Errorf("the refused run changed the host:\n%s", d)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
