package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestTextAndJSON(t *testing.T) {
	var buf bytes.Buffer
	l, err := New(&buf, Options{Format: "json", Level: "info", Stage: "kubeslot-watcher"})
	if err != nil {
		t.Fatal(err)
	}
	l.Debug("hidden")
	l.Info("claimed request", "slot", "b")
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("not one JSON record: %q", buf.String())
	}
	if rec["stage"] != "kubeslot-watcher" || rec["slot"] != "b" || rec["msg"] != "claimed request" {
		t.Errorf("record %v", rec)
	}
	buf.Reset()
	l, _ = New(&buf, Options{Format: "text", Level: "debug"})
	l.Debug("shown")
	if !strings.Contains(buf.String(), "msg=shown") {
		t.Errorf("text: %q", buf.String())
	}
}

func TestBadOptions(t *testing.T) {
	if _, err := New(nil, Options{Format: "xml", Level: "info"}); err == nil {
		t.Error("format xml accepted")
	}
	if _, err := New(nil, Options{Format: "text", Level: "loud"}); err == nil || !strings.Contains(err.Error(), `"loud"`) {
		t.Errorf("level loud: %v", err)
	}
}

func TestFieldName(t *testing.T) {
	for in, want := range map[string]string{"slot": "SLOT", "op.name": "OP_NAME", "node-name": "NODE_NAME"} {
		if got := fieldName(in); got != want {
			t.Errorf("fieldName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestUnitFromCgroup(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		// cgroup v2
		{"0::/system.slice/kubeslot-bootstrap.service\n", "kubeslot-bootstrap.service"},
		// v1 / hybrid: the name=systemd line wins
		{"12:memory:/system.slice/x.service\n1:name=systemd:/system.slice/kubeslot-repave@next.service\n0::/system.slice/kubeslot-repave@next.service\n", "kubeslot-repave@next.service"},
		// a transient unit in a delegated subtree
		{"0::/machine.slice/ks-h.scope/system.slice/ks-log-probe.service/payload\n", "ks-log-probe.service"},
		{"0::/user.slice/user-0.slice/session-3.scope\n", "session-3.scope"},
		// a hybrid host seen from a container: name=systemd is bare, the unified line names the unit (the rig)
		{"9:name=systemd:/\n8:pids:/\n0::/system.slice/ks-cg.service\n", "ks-cg.service"},
		{"0::/\n", ""},
		{"", ""},
	} {
		if got := unitFromCgroup(c.in); got != c.want {
			t.Errorf("unitFromCgroup(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
