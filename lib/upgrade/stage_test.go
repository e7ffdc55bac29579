package upgrade

import (
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/stagekit"
)

// TestJob: an upgrade's job comes from the flags and the unit's
// environment.
func TestJob(t *testing.T) {
	env := map[string]string{}
	c := Command{Host: stagekit.Host{Getenv: func(k string) string { return env[k] }},
		HealthWindow: 5 * time.Second, HealthTimeout: 45 * time.Second, LockWait: 30 * time.Second}
	j, err := c.job()
	if err != nil || j.Triggered || j.Bundle != "" {
		t.Errorf("no flags, no env: %+v, %v", j, err)
	}
	env[EnvRequest] = "upgrade"
	if j, err := c.job(); err != nil || !j.Triggered {
		t.Errorf("KUBESLOT_REQUEST=upgrade: %+v, %v; want a triggered run", j, err)
	}
}
