package watcher

// The request path units under a real systemd (252): how PathExists= behaves when a worker defers (exit 69) and
// leaves the request file in place. This is what lib/requests documents and the workers must respect.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/integration/sdhost"
	"github.com/kubeslot/kubeslot/units"
)

func TestWatcherPathUnitRetrigger(t *testing.T) {
	h := rig.StartHost(t, sdhost.Options{Name: rig.HostName("wat-path")})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := rig.Systemd(t, ctx, h)
	run := func(args ...string) string {
		t.Helper()
		out, err := h.Run(ctx, args...)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	// The restart worker stub: counts its runs, waits /srv/wait seconds (a bounded lock wait), exits 69 leaving
	// the request where it is.
	stub := "#!/bin/sh\necho run >> /srv/runs\nsleep \"$(cat /srv/wait)\"\nexit 69\n"
	if err := h.WriteFile("/opt/kubeslot/releases/blue/kubeslot-repaver", []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	run("ln", "-sfn", "releases/blue", "/opt/kubeslot/current")
	run("mkdir", "-p", "-m", "0700", "/opt/kubeslot/requests")
	all := map[string][]byte{}
	for _, n := range []string{units.PathUnit("restart"), "kubeslot-restart.service"} {
		b, err := units.Render(n, units.Vars{})
		if err != nil {
			t.Fatal(err)
		}
		all[n] = b
	}
	if err := h.InstallUnits(ctx, all); err != nil {
		t.Fatal(err)
	}
	pathState := func() string {
		p, err := c.GetUnitPropertiesContext(ctx, units.PathUnit("restart"))
		if err != nil {
			t.Fatal(err)
		}
		s, _ := c.GetUnitTypePropertiesContext(ctx, units.PathUnit("restart"), "Path")
		return p["ActiveState"].(string) + " result=" + s["Result"].(string)
	}
	runs := func() int {
		b, _ := h.ReadFile("/srv/runs")
		return strings.Count(string(b), "run")
	}
	for _, wait := range []string{"0", "1"} {
		run("systemctl", "stop", units.PathUnit("restart"), "kubeslot-restart.service")
		run("systemctl", "reset-failed")
		run("rm", "-f", "/srv/runs", "/opt/kubeslot/requests/restart.json")
		if err := h.WriteFile("/srv/wait", []byte(wait), 0o644); err != nil {
			t.Fatal(err)
		}
		run("systemctl", "start", units.PathUnit("restart"))
		if err := h.WriteFile("/opt/kubeslot/requests/restart.json", []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
		// Longer than the default start-limit interval (10 s): a tight re-trigger loop would exhaust the
		// service's start limit (5) and fail the path unit within it.
		time.Sleep(13 * time.Second)
		n, st := runs(), pathState()
		t.Logf("worker deferring after %ss with the request left in place: %d runs in 13 s, path unit %s", wait, n, st)
		if !strings.HasPrefix(st, "active") {
			t.Errorf("the path unit stopped watching: %s (ExecStopPost= must throttle re-triggers after 69)", st)
		}
		if n < 2 {
			t.Errorf("the deferred request was not retried: %d runs", n)
		}
	}
	run("systemctl", "stop", units.PathUnit("restart"), "kubeslot-restart.service")
}
