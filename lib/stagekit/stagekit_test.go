package stagekit

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/testhooks"
)

func host(t *testing.T, env map[string]string) Host {
	return Host{RootPrefix: t.TempDir(), HostRoot: "/opt/kubeslot", SystemdBus: "unix:path=/nonexistent/bus",
		Getenv: func(k string) string { return env[k] }, Log: slog.New(slog.DiscardHandler)}
}

func newerLayout(t *testing.T, h Host) {
	base := filepath.Join(h.RootPrefix, h.HostRoot)
	if err := os.MkdirAll(base, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, hostroot.LayoutFile), []byte(strconv.Itoa(hostroot.LayoutVersion+1)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestStart: the prologue's errors and their exit codes, in order.
func TestStart(t *testing.T) {
	ctx := context.Background()
	h := host(t, nil)
	h.RootPrefix = "relative"
	if _, err := Start(ctx, h, Spec{}); exitcode.Of(err) != exitcode.Usage {
		t.Errorf("relative root prefix: %v (exit %d), want a usage error", err, exitcode.Of(err))
	}

	// Another layout: 78 before the input is read, unless the stage's
	// Layout goes past it.
	h = host(t, nil)
	newerLayout(t, h)
	read := false
	input := func() error { read = true; return nil }
	if _, err := Start(ctx, h, Spec{Input: input}); exitcode.Of(err) != exitcode.HostUnfit || read {
		t.Errorf("newer layout: %v (exit %d), input read %v; want 78 before the input", err, exitcode.Of(err), read)
	}
	d, err := Start(ctx, h, Spec{Input: input, Layout: func(error) error { return nil }})
	if err != nil || !read {
		t.Fatalf("newer layout, let past: %v, input read %v", err, read)
	}
	d.Close()

	// The input's error as it is; the sandbox settings' as a usage error.
	boom := errors.New("boom")
	if _, err := Start(ctx, host(t, nil), Spec{Input: func() error { return boom }}); !errors.Is(err, boom) || exitcode.Of(err) != exitcode.Failure {
		t.Errorf("input error: %v (exit %d)", err, exitcode.Of(err))
	}
	bad := host(t, map[string]string{"KUBESLOT_NODE_KUBELET_PORT": "x"})
	if _, err := Start(ctx, bad, Spec{Sandbox: true}); exitcode.Of(err) != exitcode.Usage {
		t.Errorf("bad sandbox setting: %v (exit %d), want a usage error", err, exitcode.Of(err))
	}
	if d, err := Start(ctx, bad, Spec{}); err != nil {
		t.Errorf("sandbox settings read without Spec.Sandbox: %v", err)
	} else {
		d.Close()
	}
}

// TestPauseHookOnlyInTestBuilds: the pause hook exists only in a build with
// the test hooks; a production build ignores KUBESLOT_TEST_PAUSE_AT.
func TestPauseHookOnlyInTestBuilds(t *testing.T) {
	for _, at := range []string{"two", "nowhere"} {
		h := host(t, map[string]string{"KUBESLOT_TEST_PAUSE_AT": at})
		d, err := Start(context.Background(), h, Spec{Stage: "test", Pausable: []string{"one", "two"}})
		switch {
		case !testhooks.Enabled && (err != nil || d.Pause != nil):
			t.Errorf("production build, pause at %s: hook %v, %v; want none", at, d != nil && d.Pause != nil, err)
		case testhooks.Enabled && at == "two" && (err != nil || d.Pause == nil):
			t.Errorf("test build, pause at two: hook %v, %v", d != nil && d.Pause != nil, err)
		case testhooks.Enabled && at == "nowhere" && exitcode.Of(err) != exitcode.Usage:
			t.Errorf("test build, pause at nowhere: %v, want a usage error", err)
		}
		if d != nil {
			d.Close()
		}
	}
}

// TestBeginClose: Begin takes the lock through the stage's admission and
// Close lets it go.
func TestBeginClose(t *testing.T) {
	ctx := context.Background()
	d, err := Start(ctx, host(t, nil), Spec{})
	if err != nil {
		t.Fatal(err)
	}
	held, err := d.Begin(ctx, ownership.Prologue{Stage: "kubeslot-test"})
	if err != nil || held.Lock == nil || d.Held != held {
		t.Fatalf("begin: %+v, %v", held, err)
	}
	d.Close()
	if held.Lock != nil {
		t.Error("Close kept the lock")
	}
	refused := exitcode.Defer(errors.New("not yet"))
	d2, err := Start(ctx, Host{RootPrefix: d.RootPrefix, HostRoot: d.HostRoot, Log: d.Log}, Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if _, err := d2.Begin(ctx, ownership.Prologue{Stage: "kubeslot-test", Admit: func(*ownership.Record, error) (*ownership.Record, error) { return nil, refused }}); !errors.Is(err, refused) || d2.Held != nil {
		t.Errorf("refused admission: %v, held %v", err, d2.Held)
	}
}
