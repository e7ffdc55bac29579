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
	"github.com/kubeslot/kubeslot/lib/testkit"
)

// The stage's prologue: a busy lock and an installation that is not
// complete both defer (69), before systemd or the host is touched.
func TestCommandDefers(t *testing.T) {
	t.Parallel()
	root := testkit.Root(t)
	var out bytes.Buffer
	c := Command{Root: root, SystemdBus: "unix:path=/nonexistent/bus", Job: Job{Kind: "repave", Slot: NextSlot},
		LockWait: 200 * time.Millisecond, Getenv: func(string) string { return "" }, Stdout: &out,
		Log: slog.New(slog.DiscardHandler), Started: time.Now()}
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
