// Package clitest checks the behaviour every kubeslot binary shares on its
// command line. Imported by tests of cmd/ packages only.
package clitest

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/cli"
	"github.com/kubeslot/kubeslot/lib/exitcode"
)

// Run is a binary's testable entry point.
type Run func(args []string, stdio cli.IO) int

// Call runs a binary's entry point with buffers and returns its exit code,
// stdout and stderr.
func Call(run Run, stdin string, args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(args, cli.IO{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errb})
	return code, out.String(), errb.String()
}

// CommonFlags checks --help and --version (exit 0, output naming the
// binary) and that a bad --log-format is a usage error (exit 2).
func CommonFlags(t *testing.T, name string, run Run) {
	t.Helper()
	for _, arg := range []string{"--help", "--version"} {
		code, out, errs := Call(run, "", arg)
		if code != exitcode.OK {
			t.Errorf("%s %s: exit %d, stderr %q", name, arg, code, errs)
		}
		if !strings.Contains(out, name) {
			t.Errorf("%s %s: output %q does not name the binary", name, arg, out)
		}
	}
	if code, _, _ := Call(run, "", "--log-format", "xml"); code != exitcode.Usage {
		t.Errorf("%s --log-format xml: exit %d, want %d", name, code, exitcode.Usage)
	}
}

// UsageCase is one bad invocation: environment variables set for the run
// and the arguments.
type UsageCase struct {
	Env  map[string]string
	Args []string
}

// UsageErrors runs each case against a fresh root prefix and checks that it
// is a usage error (exit 2) that leaves the prefix untouched: bad input is
// refused before the host is.
func UsageErrors(t *testing.T, run Run, cases []UsageCase) {
	t.Helper()
	prefix := t.TempDir()
	for _, c := range cases {
		for k, v := range c.Env {
			t.Setenv(k, v)
		}
		code, _, errs := Call(run, "", append(c.Args, "--root-prefix", prefix)...)
		if code != exitcode.Usage {
			t.Errorf("%v %v: exit %d, want %d; stderr %q", c.Env, c.Args, code, exitcode.Usage, errs)
		}
		for k := range c.Env {
			t.Setenv(k, "")
		}
	}
	if ents, _ := os.ReadDir(prefix); len(ents) != 0 {
		t.Errorf("a usage error touched the host root: %v", ents)
	}
}

// EmptyRoot checks that an empty --root-prefix or --host-root, given as a
// flag or through an empty environment variable, is a usage error naming the
// flag: it must never silently mean "/" (args are what the binary needs to
// get past its own parsing, e.g. a subcommand).
func EmptyRoot(t *testing.T, name string, run Run, args ...string) {
	t.Helper()
	for _, c := range []struct {
		env        map[string]string
		flags      []string
		want, what string
	}{
		{nil, []string{"--root-prefix", ""}, "--root-prefix", "flag"},
		{nil, []string{"--root-prefix="}, "--root-prefix", "flag="},
		{map[string]string{"KUBESLOT_ROOT_PREFIX": ""}, nil, "--root-prefix", "env"},
		{nil, []string{"--root-prefix", t.TempDir(), "--host-root", ""}, "--host-root", "host-root flag"},
		{map[string]string{"KUBESLOT_HOST_ROOT": ""}, []string{"--root-prefix", t.TempDir()}, "--host-root", "host-root env"},
	} {
		for k, v := range c.env {
			t.Setenv(k, v)
		}
		code, _, errs := Call(run, "", append(append([]string{}, args...), c.flags...)...)
		if code != exitcode.Usage || !strings.Contains(errs, c.want) || !strings.Contains(errs, "empty") {
			t.Errorf("%s %s (%s): exit %d, stderr %q; want exit %d naming %s as empty", name, strings.Join(args, " "), c.what, code, errs, exitcode.Usage, c.want)
		}
		for k := range c.env {
			os.Unsetenv(k)
		}
	}
}

// CallIO is Call with any standard input (nil: empty).
func CallIO(run Run, stdin io.Reader, args ...string) (code int, stdout, stderr string) {
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	var out, errb bytes.Buffer
	code = run(args, cli.IO{Stdin: stdin, Stdout: &out, Stderr: &errb})
	return code, out.String(), errb.String()
}

// NoBus sets KUBESLOT_SYSTEMD_BUS to a socket nobody listens on, for tests
// of a stage in a temporary root prefix that must not reach systemd: it
// passes the start-up check (cli.SystemdUser), and a stage that did dial
// would fail naming that socket.
func NoBus(t *testing.T) {
	t.Helper()
	t.Setenv("KUBESLOT_SYSTEMD_BUS", "unix:path="+t.TempDir()+"/no-bus")
}

// SystemdRefusedUpFront checks that the invocation args (given a root
// prefix other than / and no bus) is refused at start-up: exit 2, an error
// naming --systemd-bus and the prefix, and nothing created under the prefix,
// where the stage would otherwise have taken the lock or written state
// before its first systemd call.
func SystemdRefusedUpFront(t *testing.T, name string, run Run, args ...string) {
	t.Helper()
	t.Setenv("KUBESLOT_SYSTEMD_BUS", "")
	os.Unsetenv("KUBESLOT_SYSTEMD_BUS")
	prefix := t.TempDir()
	code, _, errs := Call(run, "", append(append([]string{}, args...), "--root-prefix", prefix)...)
	if code != exitcode.Usage || !strings.Contains(errs, "--systemd-bus") || !strings.Contains(errs, prefix) || !strings.Contains(errs, "nothing was changed") {
		t.Errorf("%s %v in %s without a bus: exit %d, stderr %q; want exit %d naming --systemd-bus and the prefix", name, args, prefix, code, errs, exitcode.Usage)
	}
	if ents, _ := os.ReadDir(prefix); len(ents) != 0 {
		t.Errorf("%s %v: the refused run touched the root prefix: %v", name, args, ents)
	}
}
