package bootstrap

// TestVerifyRepairOnRig: `kubeslot verify` and the boot-time repair on a bootstrapped rig host,
// with the real systemd. Verify is clean after the bootstrap; then an edited unit file, a deleted enable link, a unit
// disabled with systemctl, current spelled as an absolute link and a deleted last-good make it exit 3 naming each;
// the first-boot unit started again (as at boot) repairs exactly those, one journal line each, and verify is clean
// again. Then config.toml is edited: a setting the Machine spec governs is named by verify and warned about by the
// bootstrap, which still runs; a setting only a reset changes is named by verify and refuses the bootstrap, naming
// file, field and value; the file put back, everything is clean again.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/verify"
	"github.com/kubeslot/kubeslot/units"
)

func TestVerifyRepairOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	r := rig.New(t, ctx, "vfy", false)
	r.SeedCache(ctx)
	t0 := time.Now()
	if err := r.StartUnit(ctx); err != nil {
		t.Fatalf("bootstrap unit: %v", err)
	}
	r.CheckComplete(ctx, t0)
	sh := func(script string) {
		t.Helper()
		if out, err := r.H.Run(ctx, "sh", "-ec", script); err != nil {
			t.Fatalf("%s: %v\n%s", script, err, out)
		}
	}
	var rep *verify.Report
	_, code, raw := r.Verify(ctx)
	if code != 0 {
		t.Fatalf("verify after the bootstrap: exit %d:\n%s", code, raw)
	}

	// 1. Break what verify checks, without systemd's help where a careless hand would not have it either: first
	// the units (verify renders them from current), then the release links (then the unit checks are skipped:
	// there is no release to render them from).
	sh(`echo '# edited by hand' >>/etc/systemd/system/kubeslot-restart.path
rm /etc/systemd/system/multi-user.target.wants/kubeslot-reset.path
systemctl disable kubeslot-upgrade.path`)
	brokenUnits := []struct{ check, file, field string }{
		{verify.CheckUnitFiles, "/etc/systemd/system/kubeslot-restart.path", "content"},
		{verify.CheckUnitFiles, "/etc/systemd/system/multi-user.target.wants/kubeslot-reset.path", "target"},
		{verify.CheckUnitFiles, "/etc/systemd/system/multi-user.target.wants/kubeslot-upgrade.path", "target"},
		{verify.CheckUnitsState, "kubeslot-upgrade.path", "UnitFileState"},
	}
	brokenLinks := []struct{ check, file, field string }{
		{verify.CheckCurrent, "/opt/kubeslot/current", "target"},
		{verify.CheckLastGood, "/opt/kubeslot/last-good", "presence"},
	}
	for i, broken := range [][]struct{ check, file, field string }{brokenUnits, brokenLinks} {
		if i == 1 {
			sh(`cd /opt/kubeslot && ln -sfn /opt/kubeslot/releases/blue .current.tmp && mv -T .current.tmp current && rm last-good`)
		}
		rep, code, raw = r.Verify(ctx)
		if code != verify.ExitProblems {
			t.Fatalf("verify of the broken host: exit %d, want %d:\n%s", code, verify.ExitProblems, raw)
		}
		for _, b := range broken {
			if !hasFinding(rep, b.check, b.file, b.field) {
				t.Errorf("verify of the broken host does not name %s %s %s:\n%s", b.check, b.file, b.field, raw)
			}
		}
		t.Logf("verify of the broken host (exit %d):\n%s", code, verifyText(ctx, r))
	}
	broken := append(brokenUnits, brokenLinks...)

	// 2. The first-boot unit again, as at boot: it repairs what verify named, a journal line each.
	t1 := time.Now()
	if out, err := r.H.Run(ctx, "systemctl", "restart", units.Bootstrap); err != nil {
		j, _ := r.H.Journal(ctx, units.Bootstrap)
		t.Fatalf("restart %s: %v\n%s\n%s", units.Bootstrap, err, out, rig.TailLines(j, 40))
	}
	rig.Timing(t, "verify rig: boot-time repair run", time.Since(t1))
	j, _ := r.H.Journal(ctx, units.Bootstrap)
	for _, b := range broken {
		// The journal's MESSAGE: the record's message, then its attributes as key="value".
		if !journalHas(j, ": repaired ", `check="`+b.check+`"`, `file="`+b.file+`"`, `field="`+b.field+`"`) {
			t.Errorf("the bootstrap's journal has no repair line for %s %s %s", b.check, b.file, b.field)
		}
	}
	if _, code, raw = r.Verify(ctx); code != 0 {
		t.Errorf("verify after the repair run: exit %d:\n%s\njournal:\n%s", code, raw, rig.TailLines(j, 40))
	}
	for _, l := range strings.Split(j, "\n") {
		if i := strings.Index(l, ": repaired "); i >= 0 {
			t.Logf("journal:%s", l[i+1:])
		} else if i := strings.Index(l, ": not repaired "); i >= 0 {
			t.Logf("journal:%s", l[i+1:])
		}
	}

	// 3. config.toml edited: a setting the Machine spec governs.
	cfg, err := r.H.ReadFile(rig.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	edit := func(old, new string) {
		t.Helper()
		if !strings.Contains(string(cfg), old) {
			t.Fatalf("%s has no %q", rig.ConfigPath, old)
		}
		if err := r.H.WriteFile(rig.ConfigPath, []byte(strings.Replace(string(cfg), old, new, 1)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	edit(`version = "1.37.2"`, `version = "1.37.3"`)
	rep, code, raw = r.Verify(ctx)
	if f, ok := finding(rep, verify.CheckConfig, rig.ConfigPath, "kubernetes.version"); code != verify.ExitProblems || !ok ||
		f.Value != `"1.37.3"` || !strings.Contains(f.Want, "spec.node.kubernetesVersion of Machine "+r.Node) {
		t.Errorf("verify with kubernetes.version edited: exit %d, finding %+v:\n%s", code, f, raw)
	}
	if out, err := r.H.Run(ctx, "systemctl", "restart", units.Bootstrap); err != nil {
		t.Errorf("the bootstrap with a Machine-spec setting edited: %v\n%s", err, out)
	}
	j, _ = r.H.Journal(ctx, units.Bootstrap)
	if !journalHas(j, "configuration setting not applied", `field="kubernetes.version"`, "spec.node.kubernetesVersion") {
		t.Errorf("no warning naming kubernetes.version in the journal:\n%s", rig.TailLines(j, 20))
	}

	// 4. config.toml edited: a setting only a reset changes; the bootstrap is refused, naming file, field, value.
	server := r.CP.URL()
	edit(fmt.Sprintf("server = %q", server), `server = "https://127.0.0.1:1"`)
	rep, code, raw = r.Verify(ctx)
	if f, ok := finding(rep, verify.CheckConfig, rig.ConfigPath, "cluster.server"); code != verify.ExitProblems || !ok ||
		f.Value != `"https://127.0.0.1:1"` || !strings.Contains(f.Want, "reset the host") {
		t.Errorf("verify with cluster.server edited: exit %d, finding %+v:\n%s", code, f, raw)
	}
	if out, err := r.H.Run(ctx, "systemctl", "restart", units.Bootstrap); err == nil {
		t.Errorf("the bootstrap with cluster.server edited succeeded:\n%s", out)
	}
	j, _ = r.H.Journal(ctx, units.Bootstrap)
	if !journalHas(j, rig.ConfigPath, "cluster.server = ", "https://127.0.0.1:1", "(installed ", server, "reset the host") {
		t.Errorf("the refusal does not name file, field and both values:\n%s", rig.TailLines(j, 20))
	}

	// 5. Put back: the first-boot unit runs, verify is clean.
	if err := r.H.WriteFile(rig.ConfigPath, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	sh("systemctl reset-failed " + units.Bootstrap + " && systemctl restart " + units.Bootstrap)
	if _, code, raw = r.Verify(ctx); code != 0 {
		t.Errorf("verify with the configuration put back: exit %d:\n%s", code, raw)
	}
}

// verifyText is `kubeslot verify` as an operator reads it.
func verifyText(ctx context.Context, r *rig.Rig) string {
	out, _ := r.H.Run(ctx, "/opt/kubeslot/current/kubeslot", "verify")
	return string(out)
}

func finding(rep *verify.Report, check, file, field string) (verify.Finding, bool) {
	for _, c := range rep.Checks {
		if c.Name != check {
			continue
		}
		for _, f := range c.Findings {
			if f.File == file && f.Field == field {
				return f, true
			}
		}
	}
	return verify.Finding{}, false
}

func hasFinding(rep *verify.Report, check, file, field string) bool {
	_, ok := finding(rep, check, file, field)
	return ok
}

// journalHas reports whether one line of the journal holds every part.
func journalHas(j string, parts ...string) bool {
next:
	for _, l := range strings.Split(j, "\n") {
		for _, p := range parts {
			if !strings.Contains(l, p) {
				continue next
			}
		}
		return true
	}
	return false
}
