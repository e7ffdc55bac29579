package watcher

import (
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/stagekit"
	"github.com/kubeslot/kubeslot/lib/testhooks"
)

func TestTestExitAfter(t *testing.T) {
	for _, v := range []string{"", "5s", "-1s"} {
		d, err := testExitAfter(v)
		switch {
		case v == "" && (d != nil || err != nil):
			t.Errorf("unset: %v %v", d, err)
		case v == "5s" && (d == nil || *d != 5*time.Second || err != nil):
			t.Errorf("5s: %v %v", d, err)
		case v == "-1s" && exitcode.Of(err) != exitcode.Usage:
			t.Errorf("-1s: %v, want a usage error", err)
		}
	}
}

// TestHooksOnlyInTestBuilds: a production build reads neither hook.
func TestHooksOnlyInTestBuilds(t *testing.T) {
	env := map[string]string{EnvTestExitAfter: "bad", EnvTestReadGate: t.TempDir()}
	c := Command{Host: stagekit.Host{Getenv: func(k string) string { return env[k] }}}
	if got := c.armExitHook() != nil; got != testhooks.Enabled {
		t.Errorf("exit hook armed %v, test hooks %v", got, testhooks.Enabled)
	}
	if got := c.readGate() != nil; got != testhooks.Enabled {
		t.Errorf("read gate %v, test hooks %v", got, testhooks.Enabled)
	}
}
