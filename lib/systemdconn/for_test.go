package systemdconn

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// A stage whose root prefix is not "/" never reaches this machine's own
// systemd: without an address every call is refused
// before any dial; with one, only that address is dialled.
func TestForConfinesSystemd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sandbox := t.TempDir()
	l := For(ctx, sandbox, "")
	defer l.Close()
	for name, call := range map[string]func() error{
		"stop":      func() error { return l.StopUnit(ctx, "kubeslot-watcher.service") },
		"start":     func() error { return l.StartUnit(ctx, "systemd-nspawn@a.service") },
		"reload":    func() error { return l.Reload(ctx) },
		"terminate": func() error { return l.TerminateMachine(ctx, "a") },
		"list": func() error {
			_, err := l.ListUnitsByPatterns(ctx, []string{"kubeslot-*"})
			return err
		},
	} {
		err := call()
		if !errors.Is(err, ErrNotConfined) || !strings.Contains(err.Error(), "--systemd-bus") || !strings.Contains(err.Error(), sandbox) {
			t.Errorf("%s with prefix %s and no bus: %v", name, sandbox, err)
		}
	}
	if _, made := l.once.Made(); made {
		t.Error("a connection was made")
	}
	if l := For(ctx, "/", ""); l.Refused != nil {
		t.Errorf("prefix /: %v", l.Refused)
	}
	if l := For(ctx, "//", ""); l.Refused != nil {
		t.Errorf("prefix //: %v", l.Refused)
	}
	// An explicit address is the only one dialled.
	bad := "unix:path=" + sandbox + "/no-bus"
	l = For(ctx, sandbox, bad)
	if err := l.Reload(ctx); err == nil || !strings.Contains(err.Error(), sandbox+"/no-bus") {
		t.Errorf("explicit bus: %v, want a dial error naming it", err)
	}
}
