package host

// The kubeslot unit files under a real systemd: each unit is rendered exactly as the bootstrap and `kubeslot
// ignition` install it, with a stub in place of the stage binary, and driven through the exit codes its directives
// are about. Fakes are never the only proof that a unit file works.

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/integration/sdhost"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/units"
)

// TestUnitsBootstrapOnSystemd: kubeslot-bootstrap.service, run through <base>/current like on a real host.
func TestUnitsBootstrapOnSystemd(t *testing.T) {
	h := rig.StartHost(t, sdhost.Options{Name: rig.HostName("units-boot")})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := rig.Systemd(t, ctx, h)

	unit, err := units.Render(units.Bootstrap, units.Vars{})
	if err != nil {
		t.Fatal(err)
	}
	// The stub stands in for the binary: it records how it was run and exits with the code in /srv/exit-code, so
	// one install serves every case. It lives in the release directory, reached through the relative `current`
	// link `kubeslot ignition` lays down.
	stub := `#!/bin/sh
echo "run $* root=$KUBESLOT_HOST_ROOT" >> /srv/bootstrap.runs
code=$(cat /srv/exit-code)
echo "stub bootstrap exiting $code"
exit "$code"
`
	if err := h.WriteFile("/opt/kubeslot/releases/blue/kubeslot-bootstrap", []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Run(ctx, "ln", "-sfn", "releases/blue", "/opt/kubeslot/current"); err != nil {
		t.Fatal(err)
	}
	// Only the delay between retries is shortened (30 s in the unit), so that reaching the start limit takes a
	// second instead of minutes; the start limit itself is the unit's own.
	if err := h.WriteFile("/etc/systemd/system/kubeslot-bootstrap.service.d/zz-test.conf", []byte("[Service]\nRestartSec=200ms\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// An inactive unit nobody references is garbage-collected along with its last run's properties: the pin
	// target keeps it loaded.
	t0 := time.Now()
	if err := h.InstallUnits(ctx, map[string][]byte{
		units.Bootstrap:       unit,
		"kubeslot-pin.target": []byte("[Unit]\nAfter=" + units.Bootstrap + "\n"),
	}); err != nil {
		t.Fatal(err)
	}
	rig.Timing(t, "install bootstrap unit + daemon-reload", time.Since(t0))
	start := func(unit string) string {
		t.Helper()
		ch := make(chan string, 1)
		if _, err := c.StartUnitContext(ctx, unit, "replace", ch); err != nil {
			t.Fatalf("start %s: %v", unit, err)
		}
		select {
		case r := <-ch:
			return r
		case <-ctx.Done():
			t.Fatalf("start %s: no job result: %v", unit, ctx.Err())
		}
		return ""
	}
	if r := start("kubeslot-pin.target"); r != "done" {
		t.Fatalf("pin target: job %s", r)
	}
	state := func() string {
		t.Helper()
		return rig.UnitState(t, ctx, c, units.Bootstrap)
	}
	runs := func() []string {
		data, _ := h.ReadFile("/srv/bootstrap.runs")
		return strings.Split(strings.TrimSpace(string(data)), "\n")
	}
	setExit := func(code int) {
		t.Helper()
		for _, args := range [][]string{{"systemctl", "stop", units.Bootstrap}, {"systemctl", "reset-failed", units.Bootstrap}, {"rm", "-f", "/srv/bootstrap.runs"}} {
			if out, err := h.Run(ctx, args...); err != nil && args[1] != "reset-failed" {
				t.Fatalf("%v: %v: %s", args, err, out)
			}
		}
		if err := h.WriteFile("/srv/exit-code", []byte(strconv.Itoa(code)), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("DeferredIsSuccessAndNotRestarted", func(t *testing.T) {
		setExit(exitcode.Deferred)
		t0 := time.Now()
		if r := start(units.Bootstrap); r != "done" {
			t.Errorf("start job: %s, want done (exit %d is success)", r, exitcode.Deferred)
		}
		rig.Timing(t, "bootstrap unit start -> deferred exit", time.Since(t0))
		// Long enough for several RestartSec=200ms delays: a restart, if there were one, would have happened.
		time.Sleep(time.Second)
		// RemainAfterExit=yes keeps a successful oneshot active (exited): deferral is a success, not a failure.
		want := fmt.Sprintf("ActiveState=active SubState=exited Result=success NRestarts=0 ExecMainStatus=%d", exitcode.Deferred)
		if got := state(); got != want {
			t.Errorf("after exit %d: %s, want %s", exitcode.Deferred, got, want)
		}
		if r := runs(); len(r) != 1 || r[0] != "run --config="+units.ConfigPath+" root=/opt/kubeslot" {
			t.Errorf("stub runs: %q, want one with --config=%s and KUBESLOT_HOST_ROOT=/opt/kubeslot", r, units.ConfigPath)
		}
		if out, _ := h.Run(ctx, "systemctl", "is-failed", units.Bootstrap); strings.TrimSpace(string(out)) == "failed" {
			t.Error("systemctl is-failed says failed")
		}
	})

	t.Run("FailureIsRetriedUntilTheStartLimit", func(t *testing.T) {
		setExit(exitcode.Failure)
		t0 := time.Now()
		r := start(units.Bootstrap)
		d := rig.Eventually(t, 30*time.Second, "bootstrap unit failed for good", func() (bool, string) {
			// Between retries the unit is activating (auto-restart); failed means no retry is left.
			s := state()
			return strings.HasPrefix(s, "ActiveState=failed "), s
		})
		rig.Timing(t, "exit 1 -> retries -> start limit hit", time.Since(t0))
		t.Logf("first start job: %s; failed for good after %v: %s", r, d, state())
		burst := unitInt(t, unit, "StartLimitBurst")
		got := runs()
		// The first start and every restart count against the start limit, so the stage runs exactly burst times
		// (the restart refused by the limit is still counted in NRestarts).
		if len(got) != burst {
			j, _ := h.Journal(ctx, units.Bootstrap)
			t.Errorf("stub ran %d times, want StartLimitBurst=%d: %q; journal:\n%s", len(got), burst, got, j)
		}
		if n := rig.ServiceProperty(t, ctx, c, units.Bootstrap, "NRestarts"); n.(uint32) < 1 {
			t.Errorf("NRestarts=%v, want at least 1", n)
		}
	})

	t.Run("SuccessRemainsActive", func(t *testing.T) {
		setExit(exitcode.OK)
		if r := start(units.Bootstrap); r != "done" {
			t.Errorf("start job: %s", r)
		}
		if got, want := state(), "ActiveState=active SubState=exited Result=success NRestarts=0 ExecMainStatus=0"; got != want {
			t.Errorf("after exit 0: %s, want %s", got, want)
		}
		if r := runs(); len(r) != 1 {
			t.Errorf("stub runs: %q, want 1", r)
		}
		// Starting an active unit again does nothing: a second `systemctl start` in the same boot is a no-op.
		if r := start(units.Bootstrap); r != "done" || len(runs()) != 1 {
			t.Errorf("second start: job %s, runs %q", r, runs())
		}
	})

	t.Run("Enable", func(t *testing.T) {
		if out, err := h.Run(ctx, "systemctl", "enable", units.Bootstrap); err != nil {
			t.Fatalf("systemctl enable: %v: %s", err, out)
		}
		out, err := h.Run(ctx, "systemctl", "is-enabled", units.Bootstrap)
		if s := strings.TrimSpace(string(out)); err != nil || s != "enabled" {
			t.Errorf("is-enabled: %q (%v)", s, err)
		}
		if _, err := h.ReadFile("/etc/systemd/system/multi-user.target.wants/" + units.Bootstrap); err != nil {
			t.Errorf("no multi-user.target.wants link: %v", err)
		}
	})

	t.Run("Journal", func(t *testing.T) {
		rig.Eventually(t, 20*time.Second, "stub output in the unit's journal", func() (bool, string) {
			j, err := h.Journal(ctx, units.Bootstrap)
			return err == nil && strings.Contains(j, fmt.Sprintf("stub bootstrap exiting %d", exitcode.Deferred)) &&
				strings.Contains(j, "stub bootstrap exiting 0"), j
		})
	})
}

// unitInt reads an integer setting from a unit file's text (the last assignment wins).
func unitInt(t *testing.T, unit []byte, key string) int {
	t.Helper()
	v := ""
	for _, line := range strings.Split(string(unit), "\n") {
		if k, val, ok := strings.Cut(strings.TrimSpace(line), "="); ok && k == key {
			v = strings.TrimSpace(val)
		}
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s=%q in the unit: %v", key, v, err)
	}
	return n
}
