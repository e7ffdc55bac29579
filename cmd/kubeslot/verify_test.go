package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/cli/clitest"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/verify"
	"github.com/kubeslot/kubeslot/lib/verify/verifytest"
)

func TestVerifyExitCodesAndOutput(t *testing.T) {
	root := verifytest.Healthy(t, time.Now().Add(24*time.Hour))
	prefix := root.Prefix()
	before := testkit.Tree(t, prefix)

	code, out, errs := clitest.Call(run, "", "--root-prefix", prefix, "verify", "--no-systemd")
	if code != 0 || !strings.Contains(out, "verify: ok") || !strings.Contains(out, "skipped  units-state        --no-systemd") {
		t.Fatalf("healthy: exit %d\n%s%s", code, out, errs)
	}
	code, out, _ = clitest.Call(run, "", "--root-prefix", prefix, "verify", "--no-systemd", "-o", "json")
	var rep map[string]any
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 || rep["verdict"] != "ok" || rep["hostRoot"] != "/opt/kubeslot" {
		t.Fatalf("json: exit %d, %v\n%s", code, err, out)
	}
	first := rep["checks"].([]any)[0].(map[string]any)
	if first["name"] != "installation" || first["status"] != "ok" || first["detail"] == "" {
		t.Errorf("first check %v", first)
	}

	// Without --systemd-bus a sandbox's systemd cannot be asked: cannot verify.
	code, out, _ = clitest.Call(run, "", "--root-prefix", prefix, "verify")
	if code != verify.ExitCannotVerify || !strings.Contains(out, "--systemd-bus") {
		t.Errorf("no bus: exit %d, want %d naming --systemd-bus\n%s", code, verify.ExitCannotVerify, out)
	}
	if d := testkit.TreeDiff(before, testkit.Tree(t, prefix)); d != "" {
		t.Errorf("verify changed the host root:\n%s", d)
	}

	p, _ := root.Unit("kubeslot-upgrade.path")
	if err := os.WriteFile(p, []byte("[Unit]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, _ = clitest.Call(run, "", "--root-prefix", prefix, "verify", "--no-systemd")
	if code != verify.ExitProblems || !strings.Contains(out, "PROBLEM  unit-files") ||
		!strings.Contains(out, "/etc/systemd/system/kubeslot-upgrade.path: content: differs at line 1: \"[Unit]\"") {
		t.Errorf("edited unit: exit %d, want %d naming it\n%s", code, verify.ExitProblems, out)
	}

	code, out, _ = clitest.Call(run, "", "--root-prefix", t.TempDir(), "verify")
	if code != verify.ExitCannotVerify || !strings.Contains(out, "cannot verify") || !strings.Contains(out, "not installed") {
		t.Errorf("empty root: exit %d\n%s", code, out)
	}
}
