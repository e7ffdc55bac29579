package main

// Set-up and tear-down of the demo's rig, the same one the integration tests use: the machine lock and leak
// snapshot (integration/leakcheck), the local control plane (integration/kube), the artifact mirror
// (integration/mirror) and one isolated systemd host sharing the machine's network (integration/sdhost), plus the
// small helpers every step uses: bounded waits, commands in the host, journals, and the cluster's view via kubectl.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/integration/leakcheck"
)

// Where the host sees what the machine lends it (read-only binds).
const (
	hostBinsPath   = "/srv/kubeslot-bins"   // this release's binaries (bin/)
	hostMirrorPath = "/srv/kubeslot-mirror" // the mirror's directory, to seed the artifact cache
	base           = "/opt/kubeslot"
)

// takeSnapshot takes the machine lock exclusively for the leak check's first snapshot, then keeps a shared hold for
// the demo's lifetime, as the test binaries do, so that their snapshots never see the demo's host. If another rig
// user holds the lock for longer than d.flags.lockWait, the demo goes on without a leak check and says why.
func (d *demo) takeSnapshot(ctx context.Context) {
	qctx, qcancel := context.WithTimeout(ctx, 2*time.Second)
	releaseEx, err := leakcheck.Exclusive(qctx)
	qcancel()
	if err != nil {
		d.say("waiting (up to %s) for the machine lock %s: other rig users (test runs) must finish first", d.flags.lockWait, leakcheck.LockPath())
		lctx, cancel := context.WithTimeout(ctx, d.flags.lockWait)
		releaseEx, err = leakcheck.Exclusive(lctx)
		cancel()
	}
	if err != nil {
		d.leakSkip = fmt.Sprintf("machine lock %s not free within %s (%v): leak check off", leakcheck.LockPath(), d.flags.lockWait, err)
		d.say("%s", d.leakSkip)
	} else if d.before, err = leakcheck.Take(); err != nil {
		d.before, d.leakSkip = nil, "first snapshot: "+err.Error()
	}
	// Held exclusively, Share never waits; otherwise it waits only while another process takes a snapshot.
	sctx, scancel := context.WithTimeout(ctx, d.flags.lockWait)
	d.releaseShare, err = leakcheck.Share(sctx)
	scancel()
	if releaseEx != nil {
		releaseEx()
	}
	if err != nil {
		d.releaseShare, d.before = nil, nil
		d.leakSkip = strings.TrimPrefix(d.leakSkip+"; shared machine lock: "+err.Error(), "; ")
	}
}

// tearDown stops everything the demo started, in reverse order, each part bounded, and removes its temp dir. It
// runs on every exit path, with a context of its own: the demo's may be cancelled (Ctrl-C).
func (d *demo) tearDown() error {
	var errs []error
	if d.probe != nil {
		d.probe.Stop()
		d.probe = nil
	}
	if d.host != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		if d.host.Running() {
			// The nodes first, so that their kubelets stop heartbeating before the host goes.
			_, _ = d.host.Run(ctx, "systemctl", "stop", "systemd-nspawn@a.service", "systemd-nspawn@b.service")
		}
		if err := d.host.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop host %s: %w", d.hostName, err))
		}
		cancel()
	}
	if err := d.disconnectHost(); err != nil {
		errs = append(errs, err)
	}
	if d.mirror != nil {
		if err := d.mirror.Close(); err != nil {
			errs = append(errs, fmt.Errorf("stop mirror: %w", err))
		}
	}
	if d.cp != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if err := d.cp.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop control plane: %w", err))
		}
		cancel()
	}
	if d.work != "" {
		if err := os.RemoveAll(d.work); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", d.work, err))
		}
	}
	return errors.Join(errs...)
}

// checkLeaks compares the machine with the first snapshot. Exclusive waits until other rig users are done, so it
// never mistakes their hosts for ours; it is bounded like the first wait.
func (d *demo) checkLeaks() (string, error) {
	if d.before == nil {
		if d.releaseShare != nil {
			d.releaseShare()
			d.releaseShare = nil
		}
		return "", skip("%s", d.leakSkip)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d.flags.lockWait)
	defer cancel()
	releaseEx, err := leakcheck.Exclusive(ctx)
	d.releaseShare()
	d.releaseShare = nil
	if err != nil {
		return "", skip("machine lock %s not free within %s for the last snapshot (other rig users): %v", leakcheck.LockPath(), d.flags.lockWait, err)
	}
	defer releaseEx()
	// The host's last processes may still be being reaped: Check retries until equal or 30 s.
	cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer ccancel()
	leaks, err := leakcheck.Check(cctx, d.before)
	if err != nil {
		return "", err
	}
	if len(leaks) > 0 {
		return "", fmt.Errorf("the machine is not as it was before the demo (%d differences):\n%s", len(leaks), strings.Join(leaks, "\n"))
	}
	return "the machine is as it was: mounts, cgroups, firewall, sysctls, paths, links, processes", nil
}

// say prints a progress line under the current step.
func (d *demo) say(format string, args ...any) {
	fmt.Fprintf(d.out, "    "+format+"\n", args...)
}

// waitFor polls cond every 500 ms until it holds, bounded by bound. what names what is awaited; cond returns its
// current state, shown when the wait runs out.
func (d *demo) waitFor(ctx context.Context, bound time.Duration, what string, cond func(context.Context) (bool, string, error)) error {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	last := "not checked yet"
	for {
		ok, state, err := cond(ctx)
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		if state != "" {
			last = state
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("%s: not within %s (last seen: %s)", what, bound, last)
			}
			return fmt.Errorf("%s: interrupted (last seen: %s)", what, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// inHost runs a command inside the host, bounded by 2 minutes and ctx.
func (d *demo) inHost(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := d.host.Run(ctx, args...)
	return string(out), err
}

// hostExists reports whether path exists inside the host.
func (d *demo) hostExists(ctx context.Context, path string) bool {
	_, err := d.inHost(ctx, "test", "-e", path)
	return err == nil
}

// kubectlCache is kubectl's discovery cache for the demo's cluster.
func (d *demo) kubectlCache() string { return filepath.Join(d.work, "kubectl-cache") }

// activeSlot reads <base>/applied/active in the host ("" when absent).
func (d *demo) activeSlot() string {
	b, err := d.host.ReadFile(base + "/applied/active")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// nodeReady waits until the Node is Ready with a heartbeat after since (any when zero).
func (d *demo) nodeReady(ctx context.Context, since time.Time, bound time.Duration) error {
	what := fmt.Sprintf("Node %s Ready", d.node)
	if !since.IsZero() {
		what += " with a heartbeat at or after " + since.Format("15:04:05")
	}
	return d.waitFor(ctx, bound, what, func(ctx context.Context) (bool, string, error) {
		n, err := d.admin.CoreV1().Nodes().Get(ctx, d.node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				state := fmt.Sprintf("Ready=%s, heartbeat %s", c.Status, c.LastHeartbeatTime.Format("15:04:05"))
				// The apiserver keeps a heartbeat to the second, and a restart in place can finish within the second
				// of its request: a heartbeat in that second counts (the kubelet reports again only when something
				// changes, or after minutes).
				fresh := since.IsZero() || !c.LastHeartbeatTime.Time.Before(since.Truncate(time.Second))
				return c.Status == corev1.ConditionTrue && fresh, state, nil
			}
		}
		return false, "no Ready condition yet", nil
	})
}

// unitActive waits until a unit of the host is active.
func (d *demo) unitActive(ctx context.Context, unit string, bound time.Duration) error {
	return d.waitFor(ctx, bound, unit+" active in the host", func(ctx context.Context) (bool, string, error) {
		out, _ := d.inHost(ctx, "systemctl", "is-active", unit)
		s := strings.TrimSpace(out)
		return s == "active", s, nil
	})
}

// showCluster prints what an operator sees: kubectl get machines,machineoperations,nodes -o wide.
func (d *demo) showCluster() {
	if d.cp == nil || !d.crds {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// kubectl's discovery cache goes into the demo's temp dir: ~/.kube is the machine's, and the leak check watches it.
	what, args := "machines,machineoperations,nodes", []string{}
	if d.ns != "" { // the workload's pods too (the other kinds are cluster-scoped: -n leaves them alone)
		what, args = what+",pods", []string{"-n", d.ns}
	}
	cmd := exec.CommandContext(ctx, d.flags.kubectl, append([]string{"--kubeconfig", d.cp.AdminKubeconfig(), "--cache-dir", d.kubectlCache(),
		"get", what, "-o", "wide"}, args...)...)
	out, err := cmd.CombinedOutput()
	text := strings.TrimSpace(string(out))
	if err != nil {
		text += "\n(kubectl: " + err.Error() + ")"
	}
	shown := "kubectl get " + what + " -o wide"
	if len(args) > 0 {
		shown += " " + strings.Join(args, " ")
	}
	fmt.Fprintf(d.out, "    $ %s\n%s\n", shown, indent(text, "    "))
}

// journals returns the tail of each unit's journal in the host, and the node machines' kubelet and containerd logs,
// for a failed step.
func (d *demo) journals(units []string) string {
	if d.host == nil || !d.host.Running() {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b strings.Builder
	for _, u := range units {
		j, err := d.host.Journal(ctx, u)
		if err != nil || strings.TrimSpace(j) == "" {
			continue
		}
		fmt.Fprintf(&b, "--- journalctl -u %s (last 40 lines)\n%s\n", u, tail(j, 40))
	}
	for _, slot := range []string{"a", "b"} {
		out, err := d.host.Run(ctx, "journalctl", "-M", slot, "-u", "kubelet.service", "-u", "containerd.service", "--no-pager", "-q", "-n", "20")
		if err == nil && strings.TrimSpace(string(out)) != "" {
			fmt.Fprintf(&b, "--- node %s: kubelet and containerd (last 20 lines)\n%s\n", slot, strings.TrimSpace(string(out)))
		}
	}
	return b.String()
}

// version reads the version a kubeslot binary was stamped with ("kubeslot <version>").
func version(ctx context.Context, bin string) (string, error) {
	out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w: %s", bin, err, out)
	}
	f := strings.Fields(string(out))
	if len(f) < 2 {
		return "", fmt.Errorf("%s --version printed %q, want \"<name> <version>\"", bin, out)
	}
	return f[1], nil
}

// moduleRoot is the directory holding go.mod, walking up from the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory: run the demo from the repository (make demo)")
		}
		dir = parent
	}
}
