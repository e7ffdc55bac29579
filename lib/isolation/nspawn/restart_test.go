package nspawn

import (
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/nodeconfig"
)

// TestRestartNode: a running, serving node whose host did not change keeps
// its machine (containerd restarts inside it, then the kubelet, and the
// downtime starts at the kubelet's stop); a host
// change the pre-start hook writes, or a machine that is not running,
// restarts the machine, whose start runs the hook.
func TestRestartNode(t *testing.T) {
	for _, c := range []struct {
		name    string
		prepare func(e *env, b *Backend)
		warm    bool
	}{
		{"unchanged host", nil, true},
		{"a new resolver", func(e *env, _ *Backend) { e.put("/etc/resolv.conf", []byte("nameserver 192.0.2.53\n")) }, false},
		{"machine stopped", func(e *env, b *Backend) {
			if err := b.Stop(t.Context(), "a"); err != nil {
				t.Fatal(err)
			}
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			d := e.deps(e.config(nil))
			d.Settings.HealthzPort = healthzServer(t, func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) })
			d.Settings.NodeIP = "127.0.0.1" // pinned: the hook leaves the kubelet's address alone
			o, err := NewOperator(d)
			if err != nil {
				t.Fatal(err)
			}
			b := o.Backend()
			ctx := t.Context()
			serving(t, b, "a")
			// What the machine unit's ExecStartPre= did at that start.
			if _, err := PreStart(ctx, HookDeps{Root: e.root, Record: e.rec, Settings: d.Settings}, "a"); err != nil {
				t.Fatal(err)
			}
			if c.prepare != nil {
				c.prepare(e, b)
			}
			inner, calls := len(e.run.Inner()), len(e.sd.Calls())
			t0 := time.Now()
			down, err := o.RestartNode(ctx, "a")
			if err != nil {
				t.Fatal(err)
			}
			if down.Before(t0) || down.After(time.Now()) {
				t.Errorf("downtime start %v is not inside the restart", down)
			}
			var systemctl []string
			for _, cmd := range e.run.Inner()[inner:] {
				if strings.HasPrefix(cmd, "systemctl start") || strings.HasPrefix(cmd, "systemctl stop") || strings.HasPrefix(cmd, "systemctl --force") {
					systemctl = append(systemctl, cmd)
				}
			}
			sd := e.sd.Calls()[calls:]
			if c.warm {
				// containerd first, while the kubelet serves; then the kubelet.
				if want := []string{"systemctl stop containerd.service", "systemctl start containerd.service",
					"systemctl stop kubelet.service", "systemctl start kubelet.service"}; !slices.Equal(systemctl, want) {
					t.Errorf("in the node: %q, want %q", systemctl, want)
				}
				if slices.Contains(sd, "stop systemd-nspawn@a.service") || slices.Contains(sd, "start systemd-nspawn@a.service") {
					t.Errorf("a restart of an unchanged node restarted its machine: %v", sd)
				}
				return
			}
			if !slices.Contains(sd, "start systemd-nspawn@a.service") {
				t.Errorf("the machine was not started again: %v", sd)
			}
		})
	}
}

// TestRuntimeHandover: StopRuntime stops containerd alone in a running
// node; StartRuntime marks a running (warm) node as serving and starts its
// containerd alone, and refuses a machine that does not run without
// marking it.
func TestRuntimeHandover(t *testing.T) {
	e := newEnv(t)
	b := e.backend(nil)
	ctx := t.Context()
	serving(t, b, "a")
	inner := len(e.run.Inner())
	if err := b.StopRuntime(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if got := e.run.Inner()[inner:]; !slices.Equal(got, []string{"systemctl stop containerd.service"}) {
		t.Errorf("StopRuntime ran %q in the node", got)
	}
	if err := b.Stop(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	mark := "/var/lib/machines/a" + nodeconfig.ServingFile
	if err := os.Remove(filepath.Join(e.root.Prefix(), mark)); err != nil {
		t.Fatal(err)
	}
	if b.Warm(ctx, "a") {
		t.Error("a stopped machine is warm")
	}
	if err := b.StartRuntime(ctx, "a"); err == nil || e.exists(mark) {
		t.Errorf("StartRuntime on a stopped machine: %v, marked %v", err, e.exists(mark))
	}
	if err := b.Boot(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	inner = len(e.run.Inner())
	if err := b.StartRuntime(ctx, "a"); err != nil || !e.exists(mark) {
		t.Fatalf("StartRuntime on a warm machine: %v, marked %v", err, e.exists(mark))
	}
	if got := e.run.Inner()[inner:]; !slices.Equal(got, []string{"systemctl start containerd.service"}) {
		t.Errorf("StartRuntime ran %q in the node", got)
	}
}
