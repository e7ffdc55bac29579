package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/cli/clitest"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// endless is standard input that never ends.
type endless struct{}

func (endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = '#'
	}
	return len(p), nil
}

// callWithin runs the CLI and fails the test if it does not return in 10 s.
func callWithin(t *testing.T, stdin io.Reader, args ...string) (int, string, string) {
	t.Helper()
	type result struct {
		code     int
		out, err string
	}
	done := make(chan result, 1)
	go func() {
		var r result
		r.code, r.out, r.err = clitest.CallIO(run, stdin, args...)
		done <- r
	}()
	select {
	case r := <-done:
		return r.code, r.out, r.err
	case <-time.After(10 * time.Second):
		t.Fatalf("kubeslot %s: still running after 10 s", strings.Join(args, " "))
	}
	return 0, "", ""
}

func mkfifo(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
}

// Every read is bounded and refuses what is not a regular file: a FIFO in place of the config, the layout version or a release
// file, a 3 GB state file and endless standard input each end at once
// with an error.
func TestReadsBoundedAndRegular(t *testing.T) {
	t.Run("config check FIFO", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "config.toml")
		mkfifo(t, p)
		code, _, errs := callWithin(t, nil, "config", "check", p)
		if code != exitcode.Failure || !strings.Contains(errs, "not a regular file") {
			t.Errorf("exit %d, stderr %q", code, errs)
		}
	})
	t.Run("config check endless stdin", func(t *testing.T) {
		code, _, errs := callWithin(t, endless{}, "config", "check", "-")
		if code != exitcode.Failure || !strings.Contains(errs, "larger than allowed") {
			t.Errorf("exit %d, stderr %q", code, errs)
		}
	})
	t.Run("status FIFO layout version", func(t *testing.T) {
		prefix, root := installed(t)
		p, _ := root.Path(hostroot.LayoutFile)
		os.Remove(p)
		mkfifo(t, p)
		code, out, _ := callWithin(t, nil, "--root-prefix", prefix, "status")
		if code != exitcode.Failure || !strings.Contains(out, "FIFO") {
			t.Errorf("exit %d, stdout %q", code, out)
		}
	})
	t.Run("status 3 GB applied file", func(t *testing.T) {
		prefix, root := installed(t)
		p, _ := root.Path(hostroot.AppliedDir, "a.json")
		if err := os.Truncate(p, 3<<30); err != nil {
			t.Fatal(err)
		}
		code, out, _ := callWithin(t, nil, "--root-prefix", prefix, "status")
		if code != exitcode.Failure || !strings.Contains(out, "larger than allowed") {
			t.Errorf("exit %d, stdout %q", code, out)
		}
	})
	t.Run("ignition FIFO release binary", func(t *testing.T) {
		release, _ := fakeRelease(t, "kubeslot-bootstrap")
		mkfifo(t, filepath.Join(release, "kubeslot-watcher"))
		cfg := writeConfig(t, config.Example())
		code, out, errs := callWithin(t, nil, "ignition", "--config", cfg, "--release", release, "--embed")
		if code != exitcode.Failure || !strings.Contains(errs, "not a regular file") || out != "" {
			t.Errorf("exit %d, stderr %q", code, errs)
		}
	})
	t.Run("ignition FIFO extra file", func(t *testing.T) {
		release, _ := fakeRelease(t, "kubeslot-bootstrap")
		cfg := writeConfig(t, config.Example())
		fifo := filepath.Join(t.TempDir(), "ca.crt")
		mkfifo(t, fifo)
		code, _, errs := callWithin(t, nil, "ignition", "--config", cfg, "--release", release, "--embed", "--file", "/etc/kubeslot/ca.crt="+fifo)
		if code != exitcode.Failure || !strings.Contains(errs, "not a regular file") {
			t.Errorf("exit %d, stderr %q", code, errs)
		}
	})
}
