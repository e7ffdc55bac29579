package rig

// Helpers of the repaver's rig tests (integration/repave): a bootstrapped host (the bootstrap rig, rig.go,
// used as it is), the sandbox environment given to the worker units by drop-ins, requests dropped as the watcher
// drops them, and status files read back.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/lib/nodeclient"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/transition"
)

type RepaveRig struct {
	*Rig
}

// NewRepaveRig bootstraps a host onto slot a (artifacts cached) and gives the repaver's units the rig's sandbox
// environment, as the bootstrap unit has it (the settings are not in the applied configuration yet).
func NewRepaveRig(t *testing.T, ctx context.Context, base string, persistent bool) *RepaveRig {
	t.Helper()
	return NewRepaveRigWith(t, ctx, base, Options{Persistent: persistent})
}

// NewRepaveRigWith is NewRepaveRig with the host shaped by o.
func NewRepaveRigWith(t *testing.T, ctx context.Context, base string, o Options) *RepaveRig {
	t.Helper()
	r := &RepaveRig{NewWith(t, ctx, base, o)}
	t.Cleanup(func() {
		// The bootstrap rig's clean-up stops slot a only; the node may be on b by now.
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if r.H.Running() {
			_, _ = r.H.Run(sctx, "systemctl", "stop", "systemd-nspawn@b.service")
		}
	})
	r.SeedCache(ctx)
	t0 := time.Now()
	if err := r.StartUnit(ctx); err != nil {
		t.Fatalf("bootstrap unit: %v", err)
	}
	WaitNodeHeartbeat(t, ctx, r.Admin, r.Node, time.Time{}, 3*time.Minute, r.H)
	Timing(t, "repave rig: bootstrap to Node Ready", time.Since(t0))
	r.WorkerDropIns(ctx)
	return r
}

// WorkerDropIns gives the repave and restart workers the rig's sandbox environment, as the first-boot unit has it.
func (r *RepaveRig) WorkerDropIns(ctx context.Context) {
	t := r.t
	t.Helper()
	dropIn := "[Service]\n"
	for _, e := range r.Env {
		dropIn += "Environment=" + e + "\n"
	}
	for _, u := range []string{"kubeslot-repave@.service", "kubeslot-restart.service"} {
		if err := r.H.WriteFile("/etc/systemd/system/"+u+".d/rig.conf", []byte(dropIn), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := r.H.Run(ctx, "systemctl", "daemon-reload"); err != nil {
		t.Fatalf("daemon-reload: %v\n%s", err, out)
	}
}

// Active reads applied/active and that slot's applied configuration.
func (r *RepaveRig) Active() (string, *state.Applied) {
	r.t.Helper()
	b, err := r.H.ReadFile("/opt/kubeslot/applied/active")
	if err != nil {
		r.t.Fatalf("applied/active: %v", err)
	}
	slot := strings.TrimSpace(string(b))
	data, err := r.H.ReadFile("/opt/kubeslot/applied/" + slot + ".json")
	if err != nil {
		r.t.Fatalf("applied config of the active slot %s: %v", slot, err)
	}
	var a state.Applied
	if err := json.Unmarshal(data, &a); err != nil {
		r.t.Fatal(err)
	}
	return slot, &a
}

// Drop writes a request as the watcher does: atomically (a temp file renamed into place), 0600.
func (r *RepaveRig) Drop(ctx context.Context, req *requests.Request) {
	r.t.Helper()
	req.CreatedAt = time.Now().UTC()
	data, err := json.Marshal(req)
	if err != nil {
		r.t.Fatal(err)
	}
	tmp := "/opt/kubeslot/requests/.rig-" + string(req.Kind) + ".tmp"
	if err := r.H.WriteFile(tmp, data, 0o600); err != nil {
		r.t.Fatal(err)
	}
	if out, err := r.H.Run(ctx, "mv", tmp, "/opt/kubeslot/requests/"+string(req.Kind)+".json"); err != nil {
		r.t.Fatalf("drop request: %v\n%s", err, out)
	}
}

// WaitStatus waits until status/<id>.json is finished, bounded.
func (r *RepaveRig) WaitStatus(ctx context.Context, id string, bound time.Duration) *requests.Status {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	last := "no status file"
	for {
		if data, err := r.H.ReadFile("/opt/kubeslot/status/" + id + ".json"); err == nil {
			var s requests.Status
			if err := json.Unmarshal(data, &s); err == nil {
				last = fmt.Sprintf("%s: %s", s.Phase, s.Message)
				if s.Phase.Finished() {
					return &s
				}
			}
		}
		select {
		case <-ctx.Done():
			j, _ := r.H.Journal(context.Background(), "kubeslot-repave@next.service")
			j2, _ := r.H.Journal(context.Background(), "kubeslot-restart.service")
			r.t.Fatalf("request %s not finished within %s (last: %s)\nrepave journal:\n%s\nrestart journal:\n%s\n%s",
				id, bound, last, TailLines(j, 60), TailLines(j2, 30), HostDiag(r.H))
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// LogStatus prints a finished status's phases, downtime and whole time.
func (r *RepaveRig) LogStatus(what string, s *requests.Status) time.Duration {
	r.t.Helper()
	var parts []string
	var whole time.Duration
	if len(s.Phases) > 0 {
		whole = s.UpdatedAt.Sub(s.Phases[0].StartedAt)
	}
	for _, p := range s.Phases {
		parts = append(parts, fmt.Sprintf("%s %s", p.Name, p.Duration.Round(time.Millisecond)))
	}
	r.t.Logf("%s: %s on slot %s, phases [%s]: %s", what, s.Phase, s.ActiveSlot, strings.Join(parts, ", "), s.Message)
	Timing(r.t, what+": node downtime (old kubelet stopped -> Node Ready)", s.Downtime)
	Timing(r.t, what+": whole operation", whole)
	return whole
}

func (r *RepaveRig) Phase(s *requests.Status, name string) time.Duration {
	for _, p := range s.Phases {
		if p.Name == name {
			return p.Duration
		}
	}
	return 0
}

// PauseRepaver starts the repaver by hand as a transient unit with the test hook at phase, and waits until it
// paused there.
func (r *RepaveRig) PauseRepaver(ctx context.Context, unit, phase string, args ...string) {
	r.t.Helper()
	cmd := []string{"systemd-run", "--unit=" + unit, "--collect", "--no-block"}
	for _, e := range append(append([]string(nil), r.Env...), transition.EnvPauseAt+"="+phase) {
		cmd = append(cmd, "--setenv="+e)
	}
	cmd = append(append(cmd, "/opt/kubeslot/current/kubeslot-repaver"), args...)
	if out, err := r.H.Run(ctx, cmd...); err != nil {
		r.t.Fatalf("start %s: %v\n%s", unit, err, out)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for {
		j, _ := r.H.Journal(wctx, unit)
		if strings.Contains(j, "paused before "+phase) {
			return
		}
		if out, _ := r.H.Run(wctx, "systemctl", "is-active", unit); strings.TrimSpace(string(out)) == "failed" {
			r.t.Fatalf("%s ended before pausing at %s:\n%s", unit, phase, TailLines(j, 40))
		}
		select {
		case <-wctx.Done():
			r.t.Fatalf("%s did not pause at %s:\n%s", unit, phase, TailLines(j, 40))
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// WaitResumed waits, bounded, until the repave state file is gone and kubeslot-repave@next.service is no longer
// running: an interrupted repave resumed and finished by the path unit.
func (r *RepaveRig) WaitResumed(ctx context.Context, after string, bound time.Duration) {
	r.t.Helper()
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	for {
		_, gone := r.H.Run(wctx, "test", "-e", "/opt/kubeslot/state/repave.json")
		out, _ := r.H.Run(wctx, "systemctl", "is-active", "kubeslot-repave@next.service")
		if st := strings.TrimSpace(string(out)); gone != nil && st != "active" && st != "activating" && st != "deactivating" {
			return
		}
		select {
		case <-wctx.Done():
			j, _ := r.H.Journal(context.Background(), "kubeslot-repave@next.service")
			r.t.Fatalf("the repave interrupted by %s was not resumed within %s\n%s\n%s", after, bound, TailLines(j, 60), HostDiag(r.H))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// WaitFile waits, bounded, until the host path p exists.
func (r *RepaveRig) WaitFile(ctx context.Context, p string, bound time.Duration) {
	r.t.Helper()
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	for {
		if _, err := r.H.Run(wctx, "test", "-e", p); err == nil {
			return
		}
		select {
		case <-wctx.Done():
			j, _ := r.H.Journal(context.Background(), "kubeslot-repave@next.service")
			r.t.Fatalf("%s did not appear within %s\n%s", p, bound, TailLines(j, 40))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// WaitIdle waits, bounded, until no repave request is pending or claimed, no transition is in progress, and the
// worker is not running.
func (r *RepaveRig) WaitIdle(ctx context.Context, bound time.Duration) {
	r.t.Helper()
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	for {
		_, err := r.H.Run(wctx, "sh", "-c", "! test -e /opt/kubeslot/requests/repave.json && ! test -e /opt/kubeslot/state/claimed-repave.json && ! test -e /opt/kubeslot/state/repave.json")
		out, _ := r.H.Run(wctx, "systemctl", "is-active", "kubeslot-repave@next.service")
		if st := strings.TrimSpace(string(out)); err == nil && st != "active" && st != "activating" && st != "deactivating" {
			return
		}
		select {
		case <-wctx.Done():
			j, _ := r.H.Journal(context.Background(), "kubeslot-repave@next.service")
			r.t.Fatalf("the repaver did not go idle within %s\n%s\n%s", bound, TailLines(j, 60), HostDiag(r.H))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// KubeletRestartFloor stops and starts only the kubelet of the serving node (its containerd, pods and machine left
// running) and returns the time from the stop to the Ready status of the new kubelet (its Lease renewed after the
// start) as the admin sees it, polled every 20 ms. A warm standby's downtime is at least this, a kubelet stop plus a
// kubelet start: it is the floor no ordering of the slots can go below on this machine, and
// the bench prints it beside the repave's downtime.
func (r *RepaveRig) KubeletRestartFloor(ctx context.Context, slot string) time.Duration {
	r.t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	t0 := time.Now()
	if out, err := r.H.Run(wctx, "systemctl", "-M", slot, "stop", nodeconfig.KubeletUnit); err != nil {
		r.t.Fatalf("stop the kubelet in %s: %v %s", slot, err, out)
	}
	since := time.Now()
	if out, err := r.H.Run(wctx, "systemctl", "-M", slot, "start", nodeconfig.KubeletUnit); err != nil {
		r.t.Fatalf("start the kubelet in %s: %v %s", slot, err, out)
	}
	why := "not read yet"
	for {
		n, err := r.Admin.CoreV1().Nodes().Get(wctx, r.Node, metav1.GetOptions{})
		if err == nil {
			var lease *coordinationv1.Lease
			if lease, err = r.Admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(wctx, r.Node, metav1.GetOptions{}); err == nil {
				var ok bool
				if ok, why = nodeclient.NodeReadySince(n, lease, since); ok {
					return time.Since(t0)
				}
			}
		}
		if err != nil {
			why = err.Error()
		}
		select {
		case <-wctx.Done():
			r.t.Fatalf("the restarted kubelet's Node not Ready: %s", why)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
