package bench

// Benchmarks of the agent's idle cost, printed as figures, never asserted:
//
//   - BenchmarkFleet: N watchers (lib/watcher.Run, the binary's loop) as goroutines of this process, each with its
//     own node identity and host root, against the package's control plane. Per agent: apiserver CPU, apiserver
//     memory growth, requests per minute (counted at the agents' transports, and at the apiserver), Go heap.
//   - BenchmarkWatcherIdle: one real kubeslot-watcher process on a temp host root: its RSS, CPU and the idle
//     requests per minute the apiserver saw from it.
//
// Both use the node identity as production hosts do (fleet.Install: the applied configuration's server and CA, the
// kubelet's client pair in <base>/identity, no kubeconfig), and count each agent's requests at the apiserver from its
// audit log, by user (system:node:<name>) and user agent. Neither runs the watcher under systemd:
// TestWatcherIdleOnRig measures the watcher in its unit on a bootstrapped host.
//
// The apiserver figures subtract a baseline window measured before the agents start (kube-controller-manager and
// the apiserver's own loops make requests too). Run with `make bench`, or by hand:
//
//	KUBESLOT_REQUIRE_RIG=1 KUBESLOT_KUBE_BIN=$(scripts/kube-bins.sh) go test -count=1 -p 1 -timeout 30m \
//	    -run '^$' -bench 'Fleet|WatcherIdle' -benchtime 1x ./integration/bench/
//
// Environment: KUBESLOT_FLEET_N (agents, default 200; also -kubeslot.fleet-n), KUBESLOT_BENCH_WINDOW (idle window,
// default 60s), KUBESLOT_BENCH_BASELINE (baseline window, default 30s), KUBESLOT_BENCH_SETTLE (pause between
// registration and the window, default 10s).

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/integration/fleet"
	"github.com/kubeslot/kubeslot/integration/kube"
	"github.com/kubeslot/kubeslot/integration/machineapi"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/clusterinstall"
)

var fleetN = flag.Int("kubeslot.fleet-n", 0, "agents in BenchmarkFleet (default KUBESLOT_FLEET_N, else 200)")

// benchAPI is rig.NeedAPI for a benchmark: the shared control plane with the kubeslot API installed.
func benchAPI(b *testing.B) *kube.ControlPlane {
	b.Helper()
	switch {
	case rig.Cluster != nil:
	case rig.ClusterErr != nil:
		b.Fatalf("control plane failed to start: %v", rig.ClusterErr)
	case rig.Required:
		b.Fatalf("KUBESLOT_REQUIRE_RIG=1 but the rig cannot run here: %s", rig.ClusterSkip)
	default:
		b.Skipf("rig unavailable: %s", rig.ClusterSkip)
	}
	rig.APIInstall.Once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		t0 := time.Now()
		_, rig.APIInstall.Err = clusterinstall.Install(ctx, rig.Cluster.AdminConfig(), benchLog(b))
		if rig.APIInstall.Err == nil {
			rig.Figures.Add("cluster API install", time.Since(t0))
			rig.APIInstall.Err = rig.WaitTargetPolicy(ctx, rig.Cluster)
		}
	})
	if rig.APIInstall.Err != nil {
		b.Fatalf("install the cluster API: %v", rig.APIInstall.Err)
	}
	return rig.Cluster
}

// benchLog logs warnings and errors to the benchmark's output (200 agents' info lines would drown it).
func benchLog(b *testing.B) *slog.Logger {
	return slog.New(slog.NewTextHandler(b.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func benchAdmin(b *testing.B, cp *kube.ControlPlane) *machineapi.Client {
	c, err := machineapi.New(cp.AdminConfig())
	if err != nil {
		b.Fatal(err)
	}
	return c
}

func benchEnvDuration(b *testing.B, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		b.Fatalf("%s=%q: want a positive duration like 60s", name, v)
	}
	return d
}

// benchFleetNs is the fleet sizes to run: -kubeslot.fleet-n, else KUBESLOT_FLEET_N (a comma-separated list, e.g.
// "1,200"), else 200.
func benchFleetNs(b *testing.B) []int {
	if *fleetN > 0 {
		return []int{*fleetN}
	}
	v := os.Getenv("KUBESLOT_FLEET_N")
	if v == "" {
		return []int{200}
	}
	var ns []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			b.Fatalf("KUBESLOT_FLEET_N=%q: want positive numbers separated by commas", v)
		}
		ns = append(ns, n)
	}
	return ns
}

// benchFigure reports one figure to the benchmark (unit without spaces) and to the figure table.
func benchFigure(b *testing.B, name string, v float64, unit, metric string) {
	b.ReportMetric(v, metric)
	rig.Figures.AddValue(name, v, unit)
	b.Logf("figure: %s = %.3f %s", name, v, unit)
}

func heapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func BenchmarkFleet(b *testing.B) {
	cp := benchAPI(b)
	for _, n := range benchFleetNs(b) {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) { benchFleet(b, cp, n) })
	}
}

func benchFleet(b *testing.B, cp *kube.ControlPlane, n int) {
	window := benchEnvDuration(b, "KUBESLOT_BENCH_WINDOW", time.Minute)
	baseline := benchEnvDuration(b, "KUBESLOT_BENCH_BASELINE", 30*time.Second)
	settle := benchEnvDuration(b, "KUBESLOT_BENCH_SETTLE", 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute+window+baseline)
	defer cancel()
	admin := benchAdmin(b, cp)

	// The idle control plane first, without agents, once whatever ran before has settled.
	time.Sleep(settle)
	// In two halves: how far their CPU rates differ is the noise a per-agent CPU figure is read against.
	base1, err := fleet.Observe(ctx, cp, baseline/2)
	if err != nil {
		b.Fatal(err)
	}
	base2, err := fleet.Observe(ctx, cp, baseline/2)
	if err != nil {
		b.Fatal(err)
	}
	base := base1.Then(base2)
	noise := math.Abs(base1.CPUPerMinute() - base2.CPUPerMinute())
	before, err := fleet.ReadProc(cp.PID("kube-apiserver"))
	if err != nil {
		b.Fatal(err)
	}
	heap0, gor0 := heapAlloc(), runtime.NumGoroutine()
	restore, err := fleet.RaiseInotifyInstances(n)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := restore(); err != nil {
			b.Error(err)
		}
	}()

	t0 := time.Now()
	prefix := fmt.Sprintf("fleet%d-n%d", os.Getpid(), n)
	f, err := fleet.Start(ctx, fleet.Options{CP: cp, N: n, Dir: b.TempDir(), Prefix: prefix,
		AgentVersion: "bench-fleet", Log: benchLog(b)})
	stopped := false
	stop := func() {
		if stopped || f == nil {
			return
		}
		stopped = true
		if err := f.Stop(time.Minute); err != nil {
			b.Errorf("agents: %v", err)
		}
		dctx, dcancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer dcancel()
		if err := f.DeleteMachines(dctx, admin); err != nil {
			b.Errorf("clean up: %v", err)
		}
	}
	defer stop()
	if err != nil {
		b.Fatal(err)
	}
	if err := f.WaitRegistered(ctx, admin, 15*time.Minute); err != nil {
		b.Fatal(err)
	}
	label := fmt.Sprintf("fleet N=%d: ", n)
	benchFigure(b, label+"start to all Machines registered and reported", time.Since(t0).Seconds(), rig.UnitSeconds, "s-to-registered")
	time.Sleep(settle)

	sent0, kinds0 := f.Sent(), f.SentByKind()
	self0, err := fleet.ReadProc(os.Getpid())
	if err != nil {
		b.Fatal(err)
	}
	wFrom := time.Now()
	w, err := fleet.Observe(ctx, cp, window)
	if err != nil {
		b.Fatal(err)
	}
	idle, err := fleet.CountIdle(cp, wFrom, time.Now(), fleet.AgentUser(prefix+"-"))
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("the %d agents (node identity: applied server and CA, the kubelet's client pair; in-process, not under "+
		"systemd) %s", n, idle)
	self1, err := fleet.ReadProc(os.Getpid())
	if err != nil {
		b.Fatal(err)
	}
	sent := f.Sent() - sent0
	if k := f.KindsSince(kinds0); len(k) > 0 {
		b.Logf("requests the agents sent in the window, by kind:\n  %s", strings.Join(k, "\n  "))
	}
	heap1, gor1 := heapAlloc(), runtime.NumGoroutine()
	if d, err := f.Dispatched(); err != nil || len(d) > 0 {
		b.Errorf("an idle fleet dispatched requests: %v %v", d, err)
	}
	if err := f.Err(); err != nil {
		b.Errorf("agents failed during the window: %v", err)
	}
	stop()

	perMin := func(d time.Duration, over time.Duration) float64 { return float64(d.Milliseconds()) / over.Minutes() }
	fn := float64(n)
	b.Logf("baseline %s (halves: apiserver CPU %.0f and %.0f ms/min): apiserver CPU %s, etcd CPU %s, %v requests; window %s with %d agents: apiserver CPU %s, "+
		"etcd CPU %s, %v requests at the apiserver, %d sent by the agents; apiserver RSS %d MiB before, %d MiB after",
		base.Took.Round(time.Second), base1.CPUPerMinute(), base2.CPUPerMinute(), base.CPU, base.EtcdCPU, base.Requests,
		w.Took.Round(time.Second), n, w.CPU, w.EtcdCPU,
		w.Requests, sent, before.RSS>>20, w.RSS>>20)
	cpu := (w.CPUPerMinute() - base.CPUPerMinute()) / fn
	if math.Abs(cpu) <= noise/fn {
		b.Logf("apiserver CPU per agent: %.3f ms/min, below the noise of the baseline (its halves differ by %.1f ms/min "+
			"for the whole apiserver, %.3f per agent): not told apart from an apiserver without agents", cpu, noise, noise/fn)
	}
	benchFigure(b, label+"apiserver CPU per agent", cpu, rig.UnitCPUms, "apiserver-cpu-ms/min/agent")
	benchFigure(b, label+"apiserver CPU per agent, noise of the baseline", noise/fn, rig.UnitCPUms, "apiserver-cpu-noise-ms/min/agent")
	benchFigure(b, label+"apiserver CPU during the window (whole process)", 100*w.CPU.Seconds()/w.Took.Seconds(), rig.UnitCPUPct, "apiserver-cpu-%")
	benchFigure(b, label+"etcd CPU per agent", (perMin(w.EtcdCPU, w.Took)-perMin(base.EtcdCPU, base.Took))/fn, rig.UnitCPUms, "etcd-cpu-ms/min/agent")
	benchFigure(b, label+"apiserver memory growth per agent", float64(w.RSS-before.RSS)/1024/fn, rig.UnitKiB, "apiserver-KiB/agent")
	benchFigure(b, label+"requests per agent (agent transports)", float64(sent)/w.Took.Minutes()/fn, rig.UnitPerMinute, "req/min/agent")
	benchFigure(b, label+"requests per agent (apiserver, baseline subtracted)",
		(w.PerMinute(w.Requests)-base.PerMinute(base.Requests))/fn, rig.UnitPerMinute, "apiserver-req/min/agent")
	benchFigure(b, label+"requests per agent besides watches (apiserver audit, node identity)",
		idle.PerMinute(idle.Others)/fn, rig.UnitPerMinute, "audit-req/min/agent")
	benchFigure(b, label+"watches opened per agent (apiserver audit, node identity)",
		idle.PerMinute(idle.WatchesOpened)/fn, rig.UnitPerMinute, "audit-watches/min/agent")
	benchFigure(b, label+"Go heap per agent (in-process watcher)", (float64(heap1)-float64(heap0))/1024/fn, rig.UnitKiB, "heap-KiB/agent")
	benchFigure(b, label+"CPU per agent (in-process watcher)", perMin(self1.CPU-self0.CPU, w.Took)/fn, rig.UnitCPUms, "agent-cpu-ms/min/agent")
	benchFigure(b, label+"goroutines per agent", float64(gor1-gor0)/fn, "goroutines", "goroutines/agent")
}

// BenchmarkWatcherIdle runs the real kubeslot-watcher binary once, on a temp host root with a node identity, and
// measures it idle after it registered its Machine.
func BenchmarkWatcherIdle(b *testing.B) {
	cp := benchAPI(b)
	bins, err := rig.KubeslotBins()
	if err != nil {
		b.Fatal(err)
	}
	window := benchEnvDuration(b, "KUBESLOT_BENCH_WINDOW", time.Minute)
	baseline := benchEnvDuration(b, "KUBESLOT_BENCH_BASELINE", 30*time.Second)
	settle := benchEnvDuration(b, "KUBESLOT_BENCH_SETTLE", 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute+window+baseline)
	defer cancel()
	admin := benchAdmin(b, cp)
	name := fmt.Sprintf("idle%d", os.Getpid())
	dir := b.TempDir()
	prefix := filepath.Join(dir, "host")
	if _, _, err := fleet.Install(cp, prefix, name, "devel"); err != nil {
		b.Fatal(err)
	}
	time.Sleep(settle)
	base, err := fleet.Observe(ctx, cp, baseline)
	if err != nil {
		b.Fatal(err)
	}

	logPath := filepath.Join(dir, "watcher.log")
	logf, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(bins, "kubeslot-watcher"), "--root-prefix="+prefix)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET=", "WATCHDOG_USEC=")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			b.Errorf("kubeslot-watcher still running 15 s after SIGTERM; killed")
		}
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		if err := admin.DeleteMachine(dctx, name); err != nil {
			b.Errorf("clean up: %v", err)
		}
	}()
	fail := func(format string, args ...any) {
		b.Helper()
		log, _ := os.ReadFile(logPath)
		b.Fatalf(format+"\nwatcher log:\n%s", append(args, log)...)
	}

	// Registered: the Machine exists with the agent's status.
	t0 := time.Now()
	for {
		m, err := admin.GetMachine(ctx, name)
		if err == nil && m.Status.AgentVersion != "" {
			break
		}
		select {
		case err := <-exited:
			exited <- err
			fail("kubeslot-watcher exited before registering %s: %v", name, err)
		case <-ctx.Done():
			fail("Machine %s not registered within the bound: %v", name, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	b.Logf("kubeslot-watcher registered its Machine in %s", time.Since(t0).Round(time.Millisecond))
	time.Sleep(settle)
	p0, err := fleet.ReadProc(cmd.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	wFrom := time.Now()
	w, err := fleet.Observe(ctx, cp, window)
	if err != nil {
		b.Fatal(err)
	}
	idle, err := fleet.CountIdle(cp, wFrom, time.Now(), fleet.AgentUser("", name))
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("kubeslot-watcher (node identity: applied server and CA, the kubelet's client pair; started by the test, "+
		"not by its unit: TestWatcherIdleOnRig measures the unit) %s", idle)
	p1, err := fleet.ReadProc(cmd.Process.Pid)
	if err != nil {
		fail("kubeslot-watcher during the window: %v", err)
	}
	select {
	case err := <-exited:
		exited <- err
		fail("kubeslot-watcher exited during the window: %v", err)
	default:
	}
	if entries, err := os.ReadDir(filepath.Join(prefix, "opt/kubeslot/requests")); err != nil || len(entries) > 0 {
		b.Errorf("an idle watcher dispatched requests: %v %v", entries, err)
	}
	b.Logf("baseline %s: %v requests; window %s: %v requests at the apiserver; watcher CPU %s, RSS %d KiB (anonymous "+
		"%d KiB, file %d KiB; %d KiB at the window's start; peak %d KiB)", base.Took.Round(time.Second), base.Requests,
		w.Took.Round(time.Second), w.Requests, p1.CPU-p0.CPU, p1.RSS>>10, p1.Anon>>10, p1.File>>10, p0.RSS>>10, p1.HWM>>10)
	benchFigure(b, "watcher (binary): RSS when idle", float64(p1.RSS)/(1<<20), rig.UnitMiB, "rss-MiB")
	benchFigure(b, "watcher (binary): peak RSS", float64(p1.HWM)/(1<<20), rig.UnitMiB, "peak-rss-MiB")
	benchFigure(b, "watcher (binary): CPU when idle", float64((p1.CPU-p0.CPU).Milliseconds())/w.Took.Minutes(), rig.UnitCPUms, "cpu-ms/min")
	benchFigure(b, "watcher (binary): idle requests at the apiserver (baseline subtracted)",
		w.PerMinute(w.Requests)-base.PerMinute(base.Requests), rig.UnitPerMinute, "apiserver-req/min")
	benchFigure(b, "watcher (binary, node identity): idle requests besides watches (apiserver audit)",
		idle.PerMinute(idle.Others), rig.UnitPerMinute, "audit-req/min")
	benchFigure(b, "watcher (binary, node identity): watches opened when idle (apiserver audit)",
		idle.PerMinute(idle.WatchesOpened), rig.UnitPerMinute, "audit-watches/min")
}
