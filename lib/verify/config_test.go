package verify_test

import (
	"os"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/verify"
	"github.com/kubeslot/kubeslot/lib/verify/verifytest"
)

// edited is the example configuration (what verifytest.Healthy installs)
// with old replaced by new.
func edited(t *testing.T, old, new string) []byte {
	t.Helper()
	s := string(config.Example())
	if !strings.Contains(s, old) {
		t.Fatalf("the example has no %q", old)
	}
	return []byte(strings.Replace(s, old, new, 1))
}

func TestConfigUnchangedOrTokenRotatedIsOK(t *testing.T) {
	root := verifytest.Healthy(t, year)
	c := check(t, run(t, root, verifytest.NewSystemd()), verify.CheckConfig)
	if c.Status != verify.OK || !strings.Contains(c.Detail, "/etc/kubeslot/config.toml is the configuration installed") {
		t.Fatalf("config %+v", c)
	}
	// A new join token and a comment are no difference (the fingerprint
	// leaves secrets out).
	verifytest.ConfigFile(t, root, append(edited(t, `"abcdef.0123456789abcdef"`, `"zyxwvu.0123456789abcdef"`), "# edited\n"...))
	rep := run(t, root, verifytest.NewSystemd())
	if c := check(t, rep, verify.CheckConfig); c.Status != verify.OK || rep.ExitCode() != 0 {
		t.Fatalf("config %+v, exit %d", c, rep.ExitCode())
	}
}

func TestConfigEditedNamesFieldsAndWayForward(t *testing.T) {
	root := verifytest.Healthy(t, year)
	data := edited(t, `version = "1.37.2"`, `version = "1.37.3"`)
	data = []byte(strings.Replace(string(data), `server = "https://203.0.113.10:6443"`, `server = "https://203.0.113.99:6443"`, 1))
	verifytest.ConfigFile(t, root, data)
	rep := run(t, root, verifytest.NewSystemd())
	v := wantFinding(t, rep, verify.CheckConfig, "/etc/kubeslot/config.toml", "kubernetes.version")
	if v.Value != `"1.37.3"` || !strings.Contains(v.Want, `"1.37.2"`) || !strings.Contains(v.Want, "spec.node.kubernetesVersion of Machine worker-1") {
		t.Errorf("version finding %+v: want the file's value, the node's and the Machine spec field", v)
	}
	s := wantFinding(t, rep, verify.CheckConfig, "/etc/kubeslot/config.toml", "cluster.server")
	if s.Value != `"https://203.0.113.99:6443"` || !strings.Contains(s.Want, `"https://203.0.113.10:6443" as installed`) || !strings.Contains(s.Want, "reset the host") {
		t.Errorf("server finding %+v: want both values and the reset", s)
	}
	if n := len(check(t, rep, verify.CheckConfig).Findings); n != 2 {
		t.Errorf("%d findings, want 2", n)
	}
	onlyProblem(t, rep, verify.CheckConfig)
	if strings.Contains(strings.Join(findingStrings(rep), "\n"), "0123456789abcdef\"") {
		t.Error("a finding shows the join token")
	}
}

func TestConfigMissingOrInvalid(t *testing.T) {
	root := verifytest.Healthy(t, year)
	verifytest.ConfigFile(t, root, edited(t, `lock = "30s"`, `lock = "thirty"`))
	f := wantFinding(t, run(t, root, verifytest.NewSystemd()), verify.CheckConfig, "/etc/kubeslot/config.toml", "content")
	if !strings.Contains(f.Value, "timeouts.lock") || !strings.Contains(f.Value, "thirty") {
		t.Errorf("finding %+v: want the key and the value", f)
	}
	p, _ := root.Resolve("/etc/kubeslot/config.toml")
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	wantFinding(t, run(t, root, verifytest.NewSystemd()), verify.CheckConfig, "/etc/kubeslot/config.toml", "presence")
}

func TestConfigDiffByKey(t *testing.T) {
	a, err := config.Parse("a.toml", config.Example())
	if err != nil {
		t.Fatal(err)
	}
	b, err := config.Parse("b.toml", edited(t, `"kubeslot.dev/pool" = "edge"`, `"kubeslot.dev/pool" = "core"`))
	if err != nil {
		t.Fatal(err)
	}
	diffs, err := verify.ConfigDiff(b, a)
	if err != nil {
		t.Fatal(err)
	}
	if len(diffs) != 1 || diffs[0].Field != "kubernetes.labels.kubeslot.dev/pool" || diffs[0].File != `"core"` ||
		diffs[0].Applied != `"edge"` || diffs[0].Spec != "spec.node.labels" {
		t.Errorf("diffs %+v", diffs)
	}
}

func findingStrings(rep *verify.Report) []string {
	var out []string
	for _, c := range rep.Checks {
		for _, f := range c.Findings {
			out = append(out, f.String())
		}
	}
	return out
}
