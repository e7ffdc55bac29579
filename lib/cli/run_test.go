package cli

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/alecthomas/kong"

	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/stagekit"
)

func TestRun(t *testing.T) {
	type flags struct{ Globals }
	call := func(args []string, body func(context.Context, *kong.Context, stagekit.Host) error) (int, string, bool) {
		var f flags
		var out, errs bytes.Buffer
		ran := false
		code := Run("kubeslot-test", "a test stage", &f, args, IO{Stdout: &out, Stderr: &errs}, os.Getenv, func(ctx context.Context, k *kong.Context, h stagekit.Host) error {
			ran = true
			if ctx.Err() != nil || h.Log == nil || k == nil || h.RootPrefix != "/" || h.HostRoot != "/opt/kubeslot" || h.Stdout != &out || h.Started.IsZero() {
				t.Errorf("body got ctx err %v, kong ctx %v, host %+v", ctx.Err(), k, h)
			}
			return body(ctx, k, h)
		})
		return code, out.String() + errs.String(), ran
	}
	for _, c := range []struct {
		name  string
		args  []string
		err   error
		code  int
		ran   bool
		wants []string
	}{
		{"ok", nil, nil, 0, true, nil},
		{"deferred", nil, exitcode.Defer(errors.New("busy")), exitcode.Deferred, true, []string{"deferred", "busy"}},
		{"failed", nil, errors.New("boom"), exitcode.Failure, true, []string{"failed", "boom"}},
		{"reported", nil, Reported(exitcode.Failure), exitcode.Failure, true, nil},
		{"usage", nil, exitcode.UsageError(errors.New("bad --x")), exitcode.Usage, true, []string{"bad --x"}},
		{"bad flag", []string{"--nope"}, nil, exitcode.Usage, false, []string{"--nope"}},
		{"version", []string{"--version"}, nil, 0, false, []string{"kubeslot-test"}},
		{"bad log level", []string{"--log-level", "loud"}, nil, exitcode.Usage, false, []string{"loud"}},
	} {
		code, out, ran := call(c.args, func(context.Context, *kong.Context, stagekit.Host) error { return c.err })
		if code != c.code || ran != c.ran {
			t.Errorf("%s: exit %d, body ran %v; want %d, %v\n%s", c.name, code, ran, c.code, c.ran, out)
		}
		for _, w := range c.wants {
			if !strings.Contains(out, w) {
				t.Errorf("%s: output lacks %q:\n%s", c.name, w, out)
			}
		}
		if c.name == "reported" && out != "" {
			t.Errorf("reported: want no output, got %q", out)
		}
	}
}

// A root prefix or host root that cannot be used is a usage error in every
// binary, so callers see one exit code for it.
func TestRootErrorIsUsage(t *testing.T) {
	for _, g := range []Globals{
		{RootPrefix: "relative", HostRoot: "/opt/kubeslot"},
		{RootPrefix: t.TempDir() + "/missing", HostRoot: "/opt/kubeslot"},
		{RootPrefix: t.TempDir(), HostRoot: "/"},
	} {
		if _, err := g.Root(); exitcode.Of(err) != exitcode.Usage {
			t.Errorf("%+v: %v (exit %d), want a usage error", g, err, exitcode.Of(err))
		}
	}
}

// A CLI for people says an error in one plain line, a deferral as such, and
// nothing for success or an error already reported.
func TestExitPlain(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
		out  string
	}{
		{nil, exitcode.OK, ""},
		{errors.New("cluster.server: missing"), exitcode.Failure, "kubeslot: cluster.server: missing\n"},
		{exitcode.Defer(errors.New("lock busy")), exitcode.Deferred, "kubeslot: deferred (try again later): lock busy\n"},
		{ErrReported, exitcode.Failure, ""},
	} {
		var b strings.Builder
		if code := ExitPlain(&b, "kubeslot", tc.err); code != tc.code || b.String() != tc.out {
			t.Errorf("%v: exit %d, %q; want %d, %q", tc.err, code, b.String(), tc.code, tc.out)
		}
	}
}
