package reset

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/units"
)

// TestResetRemovesJoinTokenNeverLogsIt: a whole reset, every log record
// captured: the token is gone from the configuration (checkReset), the log
// says so, and no record carries the token.
func TestResetRemovesJoinTokenNeverLogsIt(t *testing.T) {
	h := newHost(t)
	var logs bytes.Buffer
	d := h.deps()
	d.Log = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if _, err := Run(t.Context(), d); err != nil {
		t.Fatal(err)
	}
	checkReset(t, h)
	if !strings.Contains(logs.String(), "join token removed from the configuration") {
		t.Errorf("the log does not say the token was removed:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), "0123456789abcdef") {
		t.Errorf("the log holds the join token:\n%s", logs.String())
	}
}

// TestJoinTokenStep: the step on its own, for the files an operator may
// have: a link to a file kept elsewhere, none, one without a token, one
// that is not TOML, and what a run killed inside the write leaves.
func TestJoinTokenStep(t *testing.T) {
	run := func(h *host) error {
		r := &runner{d: h.deps(), rec: h.rec, log: discard()}
		return r.removeJoinToken(t.Context())
	}

	t.Run("through a link", func(t *testing.T) {
		h := newHost(t)
		const elsewhere = "/etc/fleet/kubeslot.toml"
		h.write(elsewhere, operatorConfig)
		if err := os.Chmod(h.local(elsewhere), 0o640); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(h.local(units.ConfigPath)); err != nil {
			t.Fatal(err)
		}
		h.link(units.ConfigPath, "../fleet/kubeslot.toml")
		if err := run(h); err != nil {
			t.Fatal(err)
		}
		if target, err := os.Readlink(h.local(units.ConfigPath)); err != nil || target != "../fleet/kubeslot.toml" {
			t.Errorf("the link was replaced: %q %v", target, err)
		}
		got := h.read(elsewhere)
		if strings.Contains(got, operatorToken) || !strings.Contains(got, "# "+tokenNote) {
			t.Errorf("the file the link names:\n%s", got)
		}
		if fi, err := os.Stat(h.local(elsewhere)); err != nil || fi.Mode().Perm() != 0o640 {
			t.Errorf("mode: %v %v, want 0640 as it was", fi, err)
		}
	})

	t.Run("no file", func(t *testing.T) {
		h := newHost(t)
		if err := os.Remove(h.local(units.ConfigPath)); err != nil {
			t.Fatal(err)
		}
		if err := run(h); err != nil {
			t.Fatal(err)
		}
		if h.exists(units.ConfigPath) {
			t.Error("a configuration was created")
		}
	})

	t.Run("no token", func(t *testing.T) {
		h := newHost(t)
		const cfg = "[cluster]\nkubeconfig = \"/etc/kubeslot/join.kubeconfig\"\n"
		h.write(units.ConfigPath, cfg)
		before := h.tree()
		if err := run(h); err != nil {
			t.Fatal(err)
		}
		if after := h.tree(); after != before {
			t.Errorf("a file without a token was changed:\n%s\n---\n%s", before, after)
		}
	})

	t.Run("leftover of a killed write", func(t *testing.T) {
		h := newHost(t)
		leftover := filepath.Join(filepath.Dir(h.local(units.ConfigPath)), ".config.toml.tmp-123")
		if err := os.WriteFile(leftover, []byte("half"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := run(h); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(leftover); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the temporary file of a killed write is still there: %v", err)
		}
		if strings.Contains(h.read(units.ConfigPath), operatorToken) {
			t.Error("token not removed")
		}
	})

	// Not TOML: the reset stops at this step with the record resetting and
	// the file untouched, names the file and line, never the token; once
	// the operator fixed it, a re-run finishes the reset.
	t.Run("not TOML", func(t *testing.T) {
		h := newHost(t)
		broken := strings.Replace(operatorConfig, `server = "https`, `server = https`, 1)
		h.write(units.ConfigPath, broken)
		_, err := Run(t.Context(), h.deps())
		var se *StepError
		if !errors.As(err, &se) || se.Step != StepRemoveJoinToken {
			t.Fatalf("err %v, want a failure at %s", err, StepRemoveJoinToken)
		}
		msg := err.Error()
		if !strings.Contains(msg, units.ConfigPath) || !strings.Contains(msg, "line 6") || strings.Contains(msg, "0123456789abcdef") {
			t.Errorf("error: %s", msg)
		}
		if got := h.read(units.ConfigPath); got != broken {
			t.Errorf("the file was changed:\n%s", got)
		}
		if rec, err := ownership.Load(h.root); err != nil || rec == nil || rec.Checkpoint != ownership.CheckpointResetting {
			t.Errorf("record: %+v %v, want resetting", rec, err)
		}
		h.write(units.ConfigPath, operatorConfig)
		if _, err := Run(t.Context(), h.deps()); err != nil {
			t.Fatal(err)
		}
		checkReset(t, h)
	})
}

// TestDryRunNamesTheJoinToken: the plan says the token goes, changing nothing.
func TestDryRunNamesTheJoinToken(t *testing.T) {
	h := newHost(t)
	var out bytes.Buffer
	if _, err := DryRun(h.root, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{StepRemoveJoinToken, "remove cluster.bootstrap_token from " + units.ConfigPath, "without its join token"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("dry run does not say %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "0123456789abcdef") || !strings.Contains(h.read(units.ConfigPath), operatorToken) {
		t.Errorf("dry run printed or removed the token:\n%s", out.String())
	}
}
