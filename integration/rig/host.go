package rig

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"

	"github.com/kubeslot/kubeslot/integration/sdhost"
)

// Timing reports a measured duration in the test log and as a "rig:" line on stdout; times are never asserted.
func Timing(t *testing.T, what string, d time.Duration) {
	t.Helper()
	t.Logf("timing: %s %.2fs", what, d.Seconds())
	fmt.Printf("rig: %s %.2fs\n", what, d.Seconds())
}

// HostName makes a name unique across test binaries running at once.
func HostName(base string) string { return fmt.Sprintf("%s-%d", base, os.Getpid()) }

func NeedRig(t *testing.T) {
	t.Helper()
	if err := sdhost.Available(); err != nil {
		t.Skipf("isolated systemd host not available here: %v", err)
	}
}

func HostLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// BootHost boots a host and registers its Stop. It does not end the test, so goroutines may call it.
func BootHost(t *testing.T, o sdhost.Options) (*sdhost.Host, error) {
	t.Helper()
	if o.Log == nil {
		o.Log = HostLog(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	t0 := time.Now()
	h, err := sdhost.Start(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("start host %s: %w", o.Name, err)
	}
	Timing(t, "host boot ("+o.Name+")", time.Since(t0))
	t.Cleanup(func() { StopHost(t, h, o.Name) })
	return h, nil
}

func StartHost(t *testing.T, o sdhost.Options) *sdhost.Host {
	t.Helper()
	NeedRig(t)
	h, err := BootHost(t, o)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func StopHost(t *testing.T, h *sdhost.Host, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t0 := time.Now()
	if err := h.Stop(ctx); err != nil {
		t.Errorf("stop host %s: %v", name, err)
	}
	Timing(t, "host stop ("+name+")", time.Since(t0))
}

func Systemd(t *testing.T, ctx context.Context, h *sdhost.Host) *sddbus.Conn {
	t.Helper()
	t0 := time.Now()
	c, err := h.Systemd(ctx)
	if err != nil {
		t.Fatal(err)
	}
	Timing(t, "D-Bus connect", time.Since(t0))
	t.Cleanup(c.Close)
	return c
}

// Eventually polls cond every 50 ms until it holds or the bound passes.
func Eventually(t *testing.T, bound time.Duration, what string, cond func() (bool, string)) time.Duration {
	t.Helper()
	t0 := time.Now()
	last := ""
	for time.Since(t0) < bound {
		ok, state := cond()
		if ok {
			return time.Since(t0)
		}
		last = state
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: not within %v (last: %s)", what, bound, last)
	return 0
}
