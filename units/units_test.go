package units

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-systemd/v22/unit"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/exitcode"
)

// option is one assignment of a unit file, continuation lines joined the
// way systemd joins them (backslash-newline becomes a space).
type option struct{ section, name, value string }

func parseUnit(data []byte) ([]option, error) {
	opts, err := unit.DeserializeOptions(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	out := make([]option, 0, len(opts))
	for _, o := range opts {
		v := strings.TrimSpace(strings.ReplaceAll(o.Value, "\\\n", " "))
		out = append(out, option{o.Section, o.Name, v})
	}
	return out, nil
}

// list is the effective value of a list setting such as SuccessExitStatus=:
// repeated assignments accumulate, and an empty one resets the list.
func list(opts []option, section, name string) []string {
	var l []string
	for _, o := range opts {
		if o.section != section || o.name != name {
			continue
		}
		if o.value == "" {
			l = nil
			continue
		}
		l = append(l, strings.Fields(o.value)...)
	}
	return l
}

// last is the effective value of a single-valued setting.
func last(opts []option, section, name string) (string, bool) {
	v, found := "", false
	for _, o := range opts {
		if o.section == section && o.name == name {
			v, found = o.value, true
		}
	}
	return v, found
}

// stageCommands returns the kubeslot binaries the unit's Exec*= lines run.
func stageCommands(opts []option) []string {
	var cmds []string
	for _, o := range opts {
		if o.section != "Service" || !strings.HasPrefix(o.name, "Exec") {
			continue
		}
		f := strings.Fields(o.value)
		if len(f) == 0 {
			continue
		}
		exe := f[0]
		// Strip systemd's command prefixes, but not the template token.
		for exe != "" && strings.ContainsRune("-@:+!", rune(exe[0])) && !strings.HasPrefix(exe, "@BASE@") {
			exe = exe[1:]
		}
		if strings.HasPrefix(filepath.Base(exe), "kubeslot") {
			cmds = append(cmds, exe)
		}
	}
	return cmds
}

// checkStageUnit returns what is wrong with a unit template for the rules
// every stage unit keeps; isStage is false for units that run no kubeslot
// binary (those are not checked).
func checkStageUnit(data []byte) (isStage bool, problems []string) {
	opts, err := parseUnit(data)
	if err != nil {
		return true, []string{"parse: " + err.Error()}
	}
	cmds := stageCommands(opts)
	if len(cmds) == 0 {
		return false, nil
	}
	deferred := strconv.Itoa(exitcode.Deferred)
	for _, key := range []string{"SuccessExitStatus", "RestartPreventExitStatus"} {
		if l := list(opts, "Service", key); !slices.Contains(l, deferred) {
			problems = append(problems, fmt.Sprintf("[Service] %s= is %q: must contain %s (exitcode.Deferred)", key, strings.Join(l, " "), deferred))
		}
	}
	// A layout this release does not understand (exit 78) is an operator's
	// to fix: a restart would only refuse again.
	unfit := strconv.Itoa(exitcode.HostUnfit)
	if l := list(opts, "Service", "RestartPreventExitStatus"); !slices.Contains(l, unfit) {
		problems = append(problems, fmt.Sprintf("[Service] RestartPreventExitStatus= is %q: must contain %s (exitcode.HostUnfit)", strings.Join(l, " "), unfit))
	}
	for _, c := range cmds {
		// The recovery unit alone runs the last good release's upgrader:
		// current is what it repairs.
		if c == "@BASE@/last-good/kubeslot-upgrader" {
			continue
		}
		// The resetting unit runs the resetter's own copy: releases and
		// current go during a reset.
		if c == "@BASE@/resetting/kubeslot-resetter" {
			continue
		}
		if !strings.HasPrefix(c, "@BASE@/current/") {
			problems = append(problems, fmt.Sprintf("command %s: every stage runs through @BASE@/current/ (the link the upgrader flips)", c))
		}
	}
	return true, problems
}

// TestStageUnitsListDeferred pins exitcode.Deferred into every stage unit,
// and exitcode.HostUnfit into its RestartPreventExitStatus=.
func TestStageUnitsListDeferred(t *testing.T) {
	stages := 0
	for _, name := range Names() {
		data, err := Template(name)
		if err != nil {
			t.Fatal(err)
		}
		isStage, problems := checkStageUnit(data)
		if isStage {
			stages++
		}
		for _, p := range problems {
			t.Errorf("%s: %s", name, p)
		}
	}
	if stages == 0 {
		t.Fatal("no stage unit found: the check would pass vacuously")
	}
	if _, problems := checkStageUnit(resettingTemplate); len(problems) > 0 {
		t.Errorf("%s: %s", Resetting, strings.Join(problems, "; "))
	}
	t.Logf("%d stage unit(s) checked", stages)
}

// TestDeferredCheckCatchesBadUnits proves the check above can fail, on
// units that get the parsing rules wrong in the ways a hand check would.
func TestDeferredCheckCatchesBadUnits(t *testing.T) {
	const exec = "ExecStart=@BASE@/current/kubeslot-x\n"
	cases := []struct {
		name, unit string
		ok         bool
	}{
		{"both", "[Service]\n" + exec + "SuccessExitStatus=69\nRestartPreventExitStatus=69 78\n", true},
		{"several values and repeated keys", "[Service]\n" + exec + "SuccessExitStatus=1 SIGTERM\nSuccessExitStatus=69\nRestartPreventExitStatus=2 69 SIGKILL 78\n", true},
		{"continuation lines", "[Service]\n" + exec + "SuccessExitStatus=3 \\\n  69\nRestartPreventExitStatus=4\\\n 69 78\n", true},
		{"command prefix", "[Service]\nExecStart=-@BASE@/current/kubeslot-x --flag\nSuccessExitStatus=69\nRestartPreventExitStatus=69 78\n", true},
		{"more prefixes", "[Service]\nExecStart=!!@BASE@/current/kubeslot-x\nExecStartPre=+@BASE@/current/kubeslot-y\nSuccessExitStatus=69\nRestartPreventExitStatus=69 78\n", true},
		{"not a stage", "[Service]\nExecStart=/bin/true\n", true},
		{"neither", "[Service]\n" + exec, false},
		{"no RestartPreventExitStatus", "[Service]\n" + exec + "SuccessExitStatus=69\n", false},
		{"no SuccessExitStatus", "[Service]\n" + exec + "RestartPreventExitStatus=69\n", false},
		{"wrong section", "[Unit]\nSuccessExitStatus=69\nRestartPreventExitStatus=69\n[Service]\n" + exec, false},
		{"reset by an empty assignment", "[Service]\n" + exec + "SuccessExitStatus=69\nRestartPreventExitStatus=69\nSuccessExitStatus=\n", false},
		{"169 is not 69", "[Service]\n" + exec + "SuccessExitStatus=169\nRestartPreventExitStatus=69\n", false},
		{"commented out", "[Service]\n" + exec + "#SuccessExitStatus=69\nRestartPreventExitStatus=69\n", false},
		{"no 78 (exitcode.HostUnfit)", "[Service]\n" + exec + "SuccessExitStatus=69\nRestartPreventExitStatus=69\n", false},
		{"78 only in SuccessExitStatus", "[Service]\n" + exec + "SuccessExitStatus=69 78\nRestartPreventExitStatus=69\n", false},
		{"stage not through current", "[Service]\nExecStart=/usr/bin/kubeslot-x\nSuccessExitStatus=69\nRestartPreventExitStatus=69\n", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, problems := checkStageUnit([]byte(c.unit))
			if ok := len(problems) == 0; ok != c.ok {
				t.Errorf("ok = %v, want %v; problems: %q\nunit:\n%s", ok, c.ok, problems, c.unit)
			}
		})
	}
}

// TestEmbeddedMatchesDirectory catches a unit file added here whose kind
// the go:embed pattern does not cover: it would silently not be installed.
func TestEmbeddedMatchesDirectory(t *testing.T) {
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var onDisk []string
	for _, e := range entries {
		for _, s := range Suffixes {
			if strings.HasSuffix(e.Name(), s) {
				onDisk = append(onDisk, e.Name())
			}
		}
	}
	if !slices.Equal(onDisk, Names()) {
		t.Errorf("unit files in units/: %v; embedded: %v (extend the go:embed line)", onDisk, Names())
	}
	if !slices.Contains(Names(), Bootstrap) {
		t.Errorf("%s is not embedded", Bootstrap)
	}
}

func TestBootstrapUnit(t *testing.T) {
	data, err := Render(Bootstrap, Vars{})
	if err != nil {
		t.Fatal(err)
	}
	opts, err := parseUnit(data)
	if err != nil {
		t.Fatal(err)
	}
	want := []option{
		{"Unit", "Wants", "network-online.target"},
		{"Unit", "After", "network-online.target"},
		{"Service", "Type", "oneshot"},
		{"Service", "RemainAfterExit", "yes"},
		{"Service", "Restart", "on-failure"},
		{"Service", "Environment", "KUBESLOT_HOST_ROOT=/opt/kubeslot"},
		{"Service", "ExecStart", "/opt/kubeslot/current/kubeslot-bootstrap --config=" + ConfigPath},
		{"Install", "WantedBy", "multi-user.target"},
	}
	for _, w := range want {
		if v, _ := last(opts, w.section, w.name); v != w.value {
			t.Errorf("[%s] %s=%q, want %q", w.section, w.name, v, w.value)
		}
	}
	// Bounded, and finite: a retry loop that never gives up on a fast
	// failure, or an attempt that can hang forever, is a defect.
	for _, o := range []option{{"Service", "RestartSec", ""}, {"Service", "TimeoutStartSec", ""}, {"Unit", "StartLimitIntervalSec", ""}} {
		v, found := last(opts, o.section, o.name)
		if !found || v == "0" || v == "infinity" || v == "" {
			t.Errorf("[%s] %s=%q: want a finite, non-zero duration", o.section, o.name, v)
		}
	}
	if v, _ := last(opts, "Unit", "StartLimitBurst"); v == "" || v == "0" {
		t.Errorf("[Unit] StartLimitBurst=%q: want a positive count", v)
	}
	// "Runs on every boot; the ownership record decides": no run-once guard.
	for _, o := range opts {
		if strings.HasPrefix(o.name, "Condition") || strings.HasPrefix(o.name, "Assert") {
			t.Errorf("[%s] %s=%s: the unit must run on every boot", o.section, o.name, o.value)
		}
	}
}

func TestRender(t *testing.T) {
	data, err := Render(Bootstrap, Vars{Base: "/srv/kube-slot_1.x"})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte("ExecStart=/srv/kube-slot_1.x/current/kubeslot-bootstrap ")) || bytes.Contains(data, []byte("@BASE@")) {
		t.Errorf("rendered with a custom base:\n%s", data)
	}
	all, err := All(Vars{})
	if err != nil || len(all) != len(Names()) || !bytes.Equal(all[Bootstrap], must(Render(Bootstrap, Vars{}))) {
		t.Errorf("All: %d units (%v), want %d equal to Render", len(all), err, len(Names()))
	}
	for _, bad := range []string{"opt/kubeslot", "/", "/opt/kubeslot/", "/opt/../etc", "/opt/kube slot", "/opt/%n", "/opt/a\\b", "/opt/$X", "/opt/\"x\"", "/opt/x\ny"} {
		if _, err := Render(Bootstrap, Vars{Base: bad}); err == nil {
			t.Errorf("Render with base %q: no error", bad)
		}
	}
	if _, err := Render("kubeslot-nothing.service", Vars{}); err == nil || !strings.Contains(err.Error(), Bootstrap) {
		t.Errorf("unknown unit: %v (want an error listing the known units)", err)
	}
	r, _ := Vars{}.replacer()
	if _, err := render("x.service", []byte("[Service]\nExecStart=@BASSE@/current/kubeslot-x\n"), r); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("misspelt token: %v (want an error naming line 2)", err)
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// TestSystemdAnalyzeVerify loads every rendered unit with the machine's own
// systemd (systemd-analyze verify), with stub executables in place of the
// kubeslot binaries, and refuses any complaint about them: systemd ignores
// unknown keys and unparsable values with only a warning.
func TestSystemdAnalyzeVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed")
	}
	dir := t.TempDir()
	base := filepath.Join(dir, "opt", "kubeslot")
	rendered, err := All(Vars{Base: base})
	if err != nil {
		t.Fatal(err)
	}
	if rendered[Resetting], err = RenderResetting(Vars{Base: base}, true); err != nil {
		t.Fatal(err)
	}
	unitDir := filepath.Join(dir, "units")
	if err := os.Mkdir(unitDir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name string, data []byte) string {
		p := filepath.Join(unitDir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	var paths []string
	for name, data := range rendered {
		opts, err := parseUnit(data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, exe := range stageCommands(opts) {
			if !strings.HasPrefix(exe, base+"/") {
				t.Fatalf("%s runs %s, outside the rendered base %s", name, exe, base)
			}
			if err := os.MkdirAll(filepath.Dir(exe), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(exe, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		paths = append(paths, write(name, data))
	}
	verify := func(files ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		args := append([]string{analyze, "verify", "--man=no", "--generators=no"}, files...)
		// systemd-analyze leaves /run/systemd/systemd-units-load behind on
		// the machine; as root, give it a private /run/systemd instead, so
		// the test changes nothing outside its temp dir.
		if unshare, err := exec.LookPath("unshare"); err == nil && os.Geteuid() == 0 {
			args = append([]string{unshare, "--mount", "--propagation", "private", "--", "sh", "-c",
				`mount -t tmpfs kubeslot-verify /run/systemd && exec "$0" "$@"`}, args...)
		}
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Env = append(os.Environ(), "SYSTEMD_LOG_COLOR=0", "SYSTEMD_PAGER=")
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	t0 := time.Now()
	out, err := verify(paths...)
	t.Logf("systemd-analyze verify of %d unit(s): %.2fs", len(paths), time.Since(t0).Seconds())
	if err != nil || out != "" {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}

	// The harness can fail: systemd refuses Restart=always for a oneshot
	// (exit status), and warns about an unknown key (output only).
	bad := bytes.Replace(rendered[Bootstrap], []byte("Restart=on-failure"), []byte("Restart=always"), 1)
	if out, err := verify(write("kubeslot-bad.service", bad)); err == nil {
		t.Errorf("systemd-analyze verify accepted Restart=always on a oneshot: %s", out)
	}
	typo := bytes.Replace(rendered[Bootstrap], []byte("RestartSec="), []byte("RestartSecs="), 1)
	if out, _ := verify(write("kubeslot-typo.service", typo)); !strings.Contains(out, "RestartSecs") {
		t.Errorf("systemd-analyze verify said nothing about an unknown key: %q", out)
	}
}

// Every worker unit gives a run at least the stage budget the configuration
// is validated against (config.StageBudget): systemd must never stop a run
// whose own bounds are all within their limits.
func TestWorkerTimeoutFitsStageBudget(t *testing.T) {
	for _, name := range Names() {
		b, err := Render(name, Vars{})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(name, ".service") || !strings.Contains(string(b), "Type=oneshot") || name == Recovery {
			continue
		}
		var d time.Duration
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "TimeoutStartSec="); ok {
				if d, err = time.ParseDuration(strings.Replace(v, "min", "m", 1)); err != nil {
					t.Fatalf("%s: TimeoutStartSec=%s: %v", name, v, err)
				}
			}
		}
		if d < config.StageBudget+time.Minute {
			t.Errorf("%s: TimeoutStartSec %s leaves less than a minute over config.StageBudget %s", name, d, config.StageBudget)
		}
	}
}
