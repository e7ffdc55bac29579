package repave

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/stagekit"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

// The stage's prologue: a busy lock and an installation that is not
// complete both defer (69), before systemd or the host is touched.
func TestCommandDefers(t *testing.T) {
	t.Parallel()
	root := testkit.Root(t)
	var out bytes.Buffer
	c := Command{Host: stagekit.Host{RootPrefix: root.Prefix(), HostRoot: root.Base(), SystemdBus: "unix:path=/nonexistent/bus",
		Getenv: func(string) string { return "" }, Stdout: &out, Log: slog.New(slog.DiscardHandler), Started: time.Now()},
		LockWait: 200 * time.Millisecond}
	if err := c.Run(context.Background()); exitcode.Of(err) != exitcode.Deferred || !strings.Contains(err.Error(), "not complete") {
		t.Errorf("no installation: %v (exit %d); want the deferral", err, exitcode.Of(err))
	}
	l, err := ownership.Acquire(context.Background(), root, ownership.Holder{Stage: "kubeslot-other"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if err := c.Run(context.Background()); exitcode.Of(err) != exitcode.Deferred || !strings.Contains(err.Error(), "kubeslot-other") {
		t.Errorf("lock busy: %v (exit %d); want the deferral naming the holder", err, exitcode.Of(err))
	}
	if out.Len() > 0 {
		t.Errorf("a deferred run printed %q", out.String())
	}
}

// TestJob: what to do comes from the flags, then the unit's environment.
func TestJob(t *testing.T) {
	env := map[string]string{}
	c := Command{Host: stagekit.Host{Getenv: func(k string) string { return env[k] }}}
	j, err := c.job()
	if err != nil || j.Kind != "repave" || j.Slot != "next" {
		t.Errorf("no flags, no env: %+v, %v; want repave next", j, err)
	}
	env[EnvSlot] = "b"
	if j, _ := c.job(); j.Slot != "b" {
		t.Errorf("KUBESLOT_SLOT=b: slot %q", j.Slot)
	}
	c.Slot = "a"
	if j, _ := c.job(); j.Slot != "a" {
		t.Errorf("argument a over KUBESLOT_SLOT=b: slot %q", j.Slot)
	}
	c.Slot = ""
	env[EnvRequest] = "restart"
	if j, _ := c.job(); j.Kind != "restart" {
		t.Errorf("KUBESLOT_REQUEST=restart: kind %q", j.Kind)
	}
}
