package watcher

// TestWatcherIdleOnRig: the watcher as it runs on a host in production, idle, counted at the
// apiserver. The host is bootstrapped for real (the kubelet's TLS bootstrap gives the node its client certificate),
// so the watcher runs in kubeslot-watcher.service, started by the bootstrap, with the node identity the bootstrap
// left: the applied configuration's server and CA and the kubelet's current client pair in <base>/identity, no
// kubeconfig. Its requests are told from everything else the apiserver serves (the node's own kubelet acts as the
// same user) by the audit log's user and user agent. Target: no request but watches, and those stay open for their
// server-side timeout (client-go asks 5-10 minutes); a watch cut after a client-side timeout (a 5 s rest.Config.Timeout, say)
// shows up as watches re-opened and ended early. Halfway through the window the test updates the Node and touches
// the Machine (an annotation each), as the kubelet's periodic status and other tools do: the watcher decides again,
// and must find nothing to write. The window is KUBESLOT_BENCH_WINDOW (default 60 s) after KUBESLOT_BENCH_SETTLE
// (default 10 s).

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubeslot/kubeslot/integration/fleet"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

func TestWatcherIdleOnRig(t *testing.T) {
	window := testEnvDuration(t, "KUBESLOT_BENCH_WINDOW", time.Minute)
	settle := testEnvDuration(t, "KUBESLOT_BENCH_SETTLE", 10*time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute+window)
	defer cancel()
	// The install tree on the machine's disk, as a real host has it: on the rig host's tmpfs the binary's pages
	// would be shared memory that no one can drop.
	r := rig.NewRepaveRigWith(t, ctx, "idl", rig.Options{DiskBase: true})

	// The production path: no kubeconfig in the identity directory, the kubelet's pair there.
	if out, err := r.H.Run(ctx, "test", "!", "-e", "/opt/kubeslot/identity/kubeconfig"); err != nil {
		t.Fatalf("the host has an identity kubeconfig, not the production identity path: %v %s", err, out)
	}
	// The kubelet links its current pair by the path inside the node, where the identity directory is bound.
	if out, err := r.H.Run(ctx, "test", "-L", "/opt/kubeslot/identity/kubelet-client-current.pem"); err != nil {
		t.Fatalf("no kubelet client pair in the identity directory: %v %s", err, out)
	}
	rig.Eventually(t, 2*time.Minute, "the watcher registered its Machine", func() (bool, string) {
		m, err := r.MC.GetMachine(ctx, r.Node)
		if err != nil {
			return false, err.Error()
		}
		return m.Status.AgentVersion != "", fmt.Sprintf("status %+v", m.Status)
	})
	show := func() string {
		out, _ := r.H.Run(ctx, "systemctl", "show", "-p", "ActiveState,SubState,MainPID,NRestarts", "kubeslot-watcher.service")
		return strings.Join(strings.Fields(string(out)), " ")
	}
	before := show()
	if !strings.Contains(before, "ActiveState=active") || !strings.Contains(before, "SubState=running") {
		t.Fatalf("kubeslot-watcher.service: %s", before)
	}
	time.Sleep(settle)
	from := time.Now()
	// Halfway, what reaches an idle watcher in production: its Node updated (the kubelet posts its status every 5
	// minutes at least), and its Machine touched without a spec change (an annotation, as tools add them). Each
	// makes the watcher decide again; with nothing to change, a decision must cost no request.
	time.Sleep(window / 2)
	probe := fmt.Sprintf(`{"metadata":{"annotations":{"kubeslot.dev/idle-probe":%q}}}`, time.Now().UTC().Format(time.RFC3339Nano))
	if _, err := r.Admin.CoreV1().Nodes().Patch(ctx, r.Node, types.MergePatchType, []byte(probe), metav1.PatchOptions{}); err != nil {
		t.Fatalf("annotate Node %s: %v", r.Node, err)
	}
	if err := r.MC.REST().Patch(types.MergePatchType).Resource(v1alpha1.MachinesResource).Name(r.Node).Body([]byte(probe)).
		Do(ctx).Error(); err != nil {
		t.Fatalf("annotate Machine %s: %v", r.Node, err)
	}
	time.Sleep(window - window/2)
	to := time.Now()
	rss := unitRSS(t, ctx, r)
	if after := show(); after != before {
		t.Errorf("kubeslot-watcher.service changed during the window: %s, then %s", before, after)
	}
	idle, err := fleet.CountIdle(r.CP, from, to, fleet.AgentUser("", r.Node))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubeslot-watcher.service on a bootstrapped host (node identity system:node:%s, %s) %s", r.Node, before, idle)
	others, opened := idle.PerMinute(idle.Others), idle.PerMinute(idle.WatchesOpened)
	rig.Figures.AddValue("watcher (rig host, its unit, node identity): idle requests besides watches (apiserver audit)", others, rig.UnitPerMinute)
	rig.Figures.AddValue("watcher (rig host, its unit, node identity): watches opened when idle (apiserver audit)", opened, rig.UnitPerMinute)
	rig.Figures.AddValue(idleRSSFigure, float64(rss["VmRSS"])/1024, rig.UnitMiB)
	// Where the machine's temp dir is a tmpfs (some CI machines), the binary's pages are shared memory (RssShmem),
	// not file pages, and the figure is not a real host's: said on the line.
	onDisk := "on the machine's disk"
	if rss["RssShmem"] > rss["RssFile"] {
		onDisk = "on a tmpfs (not a real host's path: its pages cannot be dropped)"
	}
	fmt.Printf("rig: watcher in its unit, node identity, idle, binary %s: RSS %d kB (anonymous %d kB, binary %d kB: "+
		"file %d kB, tmpfs %d kB; peak %d kB)\n", onDisk, rss["VmRSS"], rss["RssAnon"], rss["RssFile"]+rss["RssShmem"],
		rss["RssFile"], rss["RssShmem"], rss["VmHWM"])
	// Whether the start-up pages were released (lib/watcher/pages.go) explains the binary's share of the figure.
	rel, _ := r.H.Run(ctx, "journalctl", "-q", "-o", "cat", "-u", "kubeslot-watcher.service", "--grep", "start-up code's pages")
	fmt.Printf("rig: watcher in its unit: %s\n", strings.Join(strings.Fields(string(rel)), " "))
	fmt.Printf("rig: watcher in its unit, node identity, idle %s at the apiserver: %.2f requests/min besides watches, "+
		"%.2f watches opened/min\n", idle.Window.Round(time.Second), others, opened)
	if idle.Others > 0 {
		t.Errorf("the idle watcher made %d requests besides watches in %s", idle.Others, idle.Window.Round(time.Second))
	}
	var short []time.Duration
	for _, d := range idle.WatchesEnded {
		if d < 4*time.Minute {
			short = append(short, d)
		}
	}
	if len(short) > 0 {
		t.Errorf("%d watches ended before any server-side timeout client-go asks for (5-10 min), after %v", len(short), short)
	}
	if len(idle.OpenAtEnd) == 0 {
		t.Error("no watch of the watcher open at the end of the window")
	}
}

// testEnvDuration is benchEnvDuration for a test.
func testEnvDuration(t *testing.T, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive duration like 60s", name, v)
	}
	return d
}

// idleRSSFigure is the watcher's resident memory in its unit at the end of the idle window (target
// 15 MiB).
const idleRSSFigure = "watcher (rig host, its unit, node identity): RSS when idle"

// unitRSS reads kubeslot-watcher.service's memory from /proc/MAINPID/status (kB): VmRSS, RssAnon (heap, stacks),
// RssFile and RssShmem (the binary's pages, from a disk or a tmpfs), VmHWM (peak).
func unitRSS(t *testing.T, ctx context.Context, r *rig.RepaveRig) map[string]int64 {
	t.Helper()
	out, err := r.H.Run(ctx, "systemctl", "show", "-P", "MainPID", "kubeslot-watcher.service")
	pid := strings.TrimSpace(string(out))
	if err != nil || pid == "" || pid == "0" {
		t.Fatalf("kubeslot-watcher.service MainPID: %q %v", pid, err)
	}
	// MainPID is a PID of the host's namespace: read it through the host's own /proc.
	b, err := os.ReadFile(r.H.Root() + "/proc/" + pid + "/status")
	if err != nil {
		t.Fatalf("kubeslot-watcher.service (PID %s): %v", pid, err)
	}
	m := map[string]int64{}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		f := strings.Fields(v)
		if !ok || len(f) != 2 || f[1] != "kB" {
			continue
		}
		if n, err := strconv.ParseInt(f[0], 10, 64); err == nil {
			m[k] = n
		}
	}
	if m["VmRSS"] == 0 {
		t.Fatalf("kubeslot-watcher.service (PID %s): no VmRSS in its status", pid)
	}
	return m
}
