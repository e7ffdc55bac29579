package bench

// BenchmarkRolloutWait: what a paced rollout's coordination costs the apiserver per agent waiting for a slot,
// printed as figures, never asserted. N in-process agents (fleet.Start: lib/watcher.Run with the
// production slot timings, 60 s leases and a 10 s poll) are targeted by one Repave with spec.rollout.maxUnavailable
// 1. Nothing runs the request files: the agent that takes the slot writes its request and holds the slot (renewing
// it) for the whole benchmark, and the other N-1 sit Waiting. Two phases are measured:
//
//   - the join: from the operation's creation until every agent has written its entry (one InProgress or Pending,
//     N-1 Waiting). Each entry is a status write of the whole operation, admitted by the policies of
//     lib/api/v1alpha1/access from the request alone (DESIGN.md, "Admission cost"); a write that conflicts is
//     tried again after a jittered, doubling pause (lib/watcher, reportWaiting). Figures: the time, status writes
//     admitted and refused by conflict per agent, all requests per agent, the apiserver's CPU per admitted write,
//     and the admission policies' time per write (the apiserver's
//     apiserver_admission_controller_admission_duration_seconds of its ValidatingAdmissionPolicy plugin);
//   - the wait: a window with everyone waiting. Figures: requests per minute per waiting agent, from the
//     apiserver's apiserver_request_total by verb and resource (less the same fleet idle before the operation, so
//     the watches the idle fleet re-opens are not counted) and from its audit log by user (the holder left out);
//     apiserver CPU per waiting agent, less the idle fleet's. Target: the requests per minute do not grow with N.
//
// Run with `make bench`, or by hand:
//
//	KUBESLOT_REQUIRE_RIG=1 KUBESLOT_KUBE_BIN=$(scripts/kube-bins.sh) go test -count=1 -p 1 -timeout 40m \
//	    -run '^$' -bench '^BenchmarkRolloutWait$' -benchtime 1x ./integration/bench/
//
// Environment: KUBESLOT_ROLLOUT_N (fleet sizes, comma-separated, default 20,200), and the fleet benchmark's
// KUBESLOT_BENCH_WINDOW (the waiting window, default 60s), KUBESLOT_BENCH_BASELINE (the idle fleet's window before
// the operation, default 30s) and KUBESLOT_BENCH_SETTLE (pause before each, default 10s).

import (
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubeslot/kubeslot/integration/fleet"
	"github.com/kubeslot/kubeslot/integration/kube"
	"github.com/kubeslot/kubeslot/integration/machineapi"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/rollout"
)

// rolloutResources are the resources counted in the wait: the agent's usual ones and the rollout slots.
var rolloutResources = append(append([]string(nil), fleet.AgentResources...), v1alpha1.RolloutLeasesResource)

func BenchmarkRolloutWait(b *testing.B) {
	cp := benchAPI(b)
	ns := []int{20, 200}
	if v := os.Getenv("KUBESLOT_ROLLOUT_N"); v != "" {
		ns = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 2 {
				b.Fatalf("KUBESLOT_ROLLOUT_N=%q: want numbers of at least 2 (a holder and a waiting agent), separated by commas", v)
			}
			ns = append(ns, n)
		}
	}
	for _, n := range ns {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) { benchRolloutWait(b, cp, n) })
	}
}

// scrapeWindow is what the apiserver did in a window: its CPU and etcd's, and /metrics read at both ends (outside
// the CPU readings, as fleet.Observe does: a scrape costs the apiserver CPU of its own).
type scrapeWindow struct {
	took          time.Duration
	cpu, etcdCPU  time.Duration
	before, after fleet.Scrape
}

// startWindow scrapes and reads the CPU times; end closes the window.
func startWindow(ctx context.Context, cp *kube.ControlPlane) (end func() (scrapeWindow, error), err error) {
	s0, err := fleet.ScrapeMetrics(ctx, cp.AdminConfig(), cp.URL())
	if err != nil {
		return nil, err
	}
	a0, err := fleet.ReadProc(cp.PID("kube-apiserver"))
	if err != nil {
		return nil, err
	}
	e0, err := fleet.ReadProc(cp.PID("etcd"))
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	return func() (scrapeWindow, error) {
		a1, err := fleet.ReadProc(cp.PID("kube-apiserver"))
		if err != nil {
			return scrapeWindow{}, err
		}
		e1, err := fleet.ReadProc(cp.PID("etcd"))
		if err != nil {
			return scrapeWindow{}, err
		}
		took := time.Since(t0)
		s1, err := fleet.ScrapeMetrics(ctx, cp.AdminConfig(), cp.URL())
		if err != nil {
			return scrapeWindow{}, err
		}
		return scrapeWindow{took: took, cpu: a1.CPU - a0.CPU, etcdCPU: e1.CPU - e0.CPU, before: s0, after: s1}, nil
	}, nil
}

// observeWindow is a window of d.
func observeWindow(ctx context.Context, cp *kube.ControlPlane, d time.Duration) (scrapeWindow, error) {
	end, err := startWindow(ctx, cp)
	if err != nil {
		return scrapeWindow{}, err
	}
	select {
	case <-ctx.Done():
		return scrapeWindow{}, ctx.Err()
	case <-time.After(d):
	}
	return end()
}

// cpuPerMinute is the apiserver's CPU per minute of the window, in milliseconds.
func (w scrapeWindow) cpuPerMinute() float64 { return float64(w.cpu.Milliseconds()) / w.took.Minutes() }

// requests is the growth of apiserver_request_total over resources, by "VERB resource[/subresource] code".
func (w scrapeWindow) requests(resources []string) map[string]float64 {
	out := map[string]float64{}
	for _, r := range resources {
		where := map[string]string{"resource": r}
		g := fleet.Growth(w.before.Sum("apiserver_request_total", where, "verb", "subresource", "code"),
			w.after.Sum("apiserver_request_total", where, "verb", "subresource", "code"))
		for k, v := range g {
			f := strings.Fields(k + " x") // verb [subresource] code x
			key := f[0] + " " + r
			if len(f) == 4 {
				key += "/" + f[1]
			}
			out[key+" "+f[len(f)-2]] += v
		}
	}
	return out
}

// admission is the growth of the time the ValidatingAdmissionPolicy admission plugin spent on UPDATE requests
// (seconds: every policy that matched, all of its parameter runs) and of the requests it ran for. The per-policy
// metric (apiserver_validating_admission_policy_check_duration_seconds) cannot stand in: the apiserver records it
// only for refusals and evaluation errors.
func (w scrapeWindow) admission() (secs, requests float64) {
	const m = "apiserver_admission_controller_admission_duration_seconds"
	where := map[string]string{"name": "ValidatingAdmissionPolicy", "operation": "UPDATE", "type": "validate"}
	secs = fleet.Total(fleet.Growth(w.before.Sum(m+"_sum", where), w.after.Sum(m+"_sum", where)))
	requests = fleet.Total(fleet.Growth(w.before.Sum(m+"_count", where), w.after.Sum(m+"_count", where)))
	return secs, requests
}

// perMinute scales each count of m to one minute of d, divided by per.
func perMinute(m map[string]float64, d time.Duration, per float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		out[k] = v / d.Minutes() / per
	}
	return out
}

// less is a less b, by key (negative differences kept: they show the noise).
func less(a, b map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range a {
		out[k] = v - b[k]
	}
	for k, v := range b {
		if _, ok := a[k]; !ok {
			out[k] = -v
		}
	}
	return out
}

func benchRolloutWait(b *testing.B, cp *kube.ControlPlane, n int) {
	window := benchEnvDuration(b, "KUBESLOT_BENCH_WINDOW", time.Minute)
	baseline := benchEnvDuration(b, "KUBESLOT_BENCH_BASELINE", 30*time.Second)
	settle := benchEnvDuration(b, "KUBESLOT_BENCH_SETTLE", 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute+window+baseline)
	defer cancel()
	admin := benchAdmin(b, cp)
	restore, err := fleet.RaiseInotifyInstances(n)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := restore(); err != nil {
			b.Error(err)
		}
	}()

	prefix := fmt.Sprintf("rw%d-n%d", os.Getpid(), n)
	opName := prefix + "-repave"
	f, err := fleet.Start(ctx, fleet.Options{CP: cp, N: n, Dir: b.TempDir(), Prefix: prefix,
		AgentVersion: "bench-rollout", Log: benchLog(b)})
	defer func() {
		if f != nil {
			if err := f.Stop(time.Minute); err != nil {
				b.Errorf("agents: %v", err)
			}
		}
		dctx, dcancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer dcancel()
		if err := admin.DeleteOperation(dctx, opName); err != nil && !apierrors.IsNotFound(err) {
			b.Errorf("clean up: %v", err)
		}
		if f != nil {
			if err := f.DeleteMachines(dctx, admin); err != nil {
				b.Errorf("clean up: %v", err)
			}
		}
	}()
	if err != nil {
		b.Fatal(err)
	}
	if err := f.WaitRegistered(ctx, admin, 15*time.Minute); err != nil {
		b.Fatal(err)
	}
	for _, name := range f.Names() {
		m, err := admin.GetMachine(ctx, name)
		if err == nil {
			if m.Labels == nil {
				m.Labels = map[string]string{}
			}
			m.Labels["rollout-bench"] = prefix
			_, err = admin.UpdateMachine(ctx, m)
		}
		if err != nil {
			b.Fatalf("label Machine %s: %v", name, err)
		}
	}
	rig.Enroll(b, ctx, cp, f.Names()...)

	// The same fleet idle first: what its agents cost without an operation is the fleet benchmark's figure, not
	// the coordination's. In two halves, whose CPU rates differ by the noise a per-agent CPU figure is read against.
	time.Sleep(settle)
	idle1, err := observeWindow(ctx, cp, baseline/2)
	if err != nil {
		b.Fatal(err)
	}
	idle2, err := observeWindow(ctx, cp, baseline/2)
	if err != nil {
		b.Fatal(err)
	}
	noise := math.Abs(idle1.cpuPerMinute() - idle2.cpuPerMinute())
	idleTook := idle1.took + idle2.took
	idleCounts := idle1.requests(rolloutResources)
	for k, v := range idle2.requests(rolloutResources) {
		idleCounts[k] += v
	}
	idleReq := perMinute(idleCounts, idleTook, 1)
	idleCPU := float64((idle1.cpu + idle2.cpu).Milliseconds()) / idleTook.Minutes()

	// The join.
	endJoin, err := startWindow(ctx, cp)
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	op := &v1alpha1.MachineOperation{Spec: v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationRepave,
		MachineSelector: &v1alpha1.MachineSelector{MatchLabels: map[string]string{"rollout-bench": prefix}},
		Rollout:         &v1alpha1.Rollout{MaxUnavailable: &intstr.IntOrString{IntVal: 1}}}}
	op.Name = opName
	if _, err := admin.CreateOperation(ctx, op); err != nil {
		b.Fatal(err)
	}
	joined, joinErr := waitJoined(ctx, admin, opName, n, joinBound)
	joinTook := time.Since(t0)
	join, err := endJoin()
	if err != nil {
		b.Fatal(err)
	}
	writes := join.requests([]string{v1alpha1.MachineOperationsResource})
	admitted, conflicts := writes["PATCH machineoperations/status 200"], writes["PATCH machineoperations/status 409"]
	admSecs, admReqs := join.admission()
	b.Logf("join: after %s, %s; requests on operations at the apiserver:\n  %s", joinTook.Round(time.Millisecond),
		joined, strings.Join(fleet.Lines(writes, 1, "%.0f %s"), "\n  "))
	b.Logf("join: apiserver CPU %s, etcd CPU %s; ValidatingAdmissionPolicy on UPDATEs: %.0f requests, %.3f s",
		join.cpu, join.etcdCPU, admReqs, admSecs)
	label := fmt.Sprintf("rollout wait N=%d: ", n)
	if joinErr == nil {
		benchFigure(b, label+"operation created to every target's entry written (join)", joinTook.Seconds(), rig.UnitSeconds, "s-join")
	}
	benchFigure(b, label+"status writes admitted per agent (join)", admitted/float64(n), "writes", "writes/agent")
	benchFigure(b, label+"status writes refused by conflict per agent (join)", conflicts/float64(n), "writes", "conflicts/agent")
	all := join.requests(rolloutResources)
	b.Logf("join: all the fleet's requests at the apiserver:\n  %s", strings.Join(fleet.Lines(all, 1, "%.0f %s"), "\n  "))
	benchFigure(b, label+"requests per agent during the join (apiserver counters, all kinds)", fleet.Total(all)/float64(n),
		"requests", "join-requests/agent")
	if admitted > 0 {
		benchFigure(b, label+"apiserver CPU per admitted status write (join, all of it)",
			float64(join.cpu.Microseconds())/1000/admitted, "ms", "apiserver-cpu-ms/write")
		benchFigure(b, label+"admission policies' time per admitted status write (join)",
			admSecs*1000/admitted, "ms", "admission-ms/write")
	}
	if admReqs > 0 {
		benchFigure(b, label+"admission policies' time per UPDATE they checked (join)", admSecs*1000/admReqs, "ms", "admission-ms/update")
	}
	if joinErr != nil {
		// The figures above say what the join cost until it gave up: no wait to measure.
		b.Fatal(joinErr)
	}

	// The wait: one holder, n-1 waiting.
	time.Sleep(settle)
	ls, err := rollout.REST{Client: admin.REST()}.List(ctx, opName)
	if err != nil {
		b.Fatal(err)
	}
	if len(ls) != 1 {
		b.Fatalf("%d rollout slots taken, want 1 (maxUnavailable 1): %v", len(ls), rollout.Names(ls))
	}
	holder := ls[0].Spec.HolderIdentity
	wFrom := time.Now()
	w, err := observeWindow(ctx, cp, window)
	if err != nil {
		b.Fatal(err)
	}
	agents := fleet.AgentUser(prefix + "-")
	audit, err := fleet.CountIdle(cp, wFrom, time.Now(), func(e kube.AuditEvent) bool {
		return agents(e) && e.User.Username != "system:node:"+holder
	})
	if err != nil {
		b.Fatal(err)
	}
	cur, err := admin.GetOperation(ctx, opName)
	if err != nil {
		b.Fatal(err)
	}
	if got := countPhase(cur, v1alpha1.OperationWaiting); got != n-1 {
		b.Errorf("after the window %d entries are Waiting, want %d: %s", got, n-1, rig.DescribeOp(cur))
	}
	if ls, err := (rollout.REST{Client: admin.REST()}).List(ctx, opName); err != nil || len(ls) != 1 || ls[0].Spec.HolderIdentity != holder {
		b.Errorf("after the window the slots are %v (%v), want only %s's", rollout.Names(ls), err, holder)
	}
	if err := f.Err(); err != nil {
		b.Errorf("agents failed: %v", err)
	}

	waiting := float64(n - 1)
	byKind := less(perMinute(w.requests(rolloutResources), w.took, 1), idleReq)
	perAgent := map[string]float64{}
	for k, v := range byKind {
		perAgent[k] = v / waiting
	}
	b.Logf("wait: %d waiting, %s holds %s; requests per minute per waiting agent at the apiserver, idle fleet "+
		"subtracted (the holder's renewals included):\n  %s", n-1, holder, ls[0].Name,
		strings.Join(fleet.Lines(perAgent, 1, "%.3f %s"), "\n  "))
	b.Logf("wait: the waiting agents %s", audit)
	cpu := (w.cpuPerMinute() - idleCPU) / waiting
	b.Logf("wait: apiserver CPU %.0f ms/min in the window, %.0f ms/min idle (halves %.0f and %.0f), etcd CPU %s",
		w.cpuPerMinute(), idleCPU, idle1.cpuPerMinute(), idle2.cpuPerMinute(), w.etcdCPU)
	benchFigure(b, label+"requests per minute per waiting agent (apiserver counters, idle fleet subtracted)",
		fleet.Total(perAgent), rig.UnitPerMinute, "req/min/waiting-agent")
	benchFigure(b, label+"requests per minute per waiting agent besides watches (apiserver audit, holder left out)",
		audit.PerMinute(audit.Others)/waiting, rig.UnitPerMinute, "audit-req/min/waiting-agent")
	benchFigure(b, label+"apiserver CPU per waiting agent (idle fleet subtracted)", cpu, rig.UnitCPUms, "apiserver-cpu-ms/min/waiting-agent")
	benchFigure(b, label+"apiserver CPU per waiting agent, noise of the idle fleet", noise/waiting, rig.UnitCPUms, "apiserver-cpu-noise-ms/min/waiting-agent")
}

// joinBound bounds the join; if it runs out, the figures of the join are reported as far as it came. With the
// policy run per Machine on every status write it was not enough at N = 200 (DESIGN.md, "Paced rollouts").
const joinBound = 10 * time.Minute

// waitJoined polls the operation (once a second, bounded by d) until it has n entries, n-1 of them Waiting, and
// returns its counts (as far as they came, also with an error).
func waitJoined(ctx context.Context, admin *machineapi.Client, name string, n int, d time.Duration) (string, error) {
	deadline := time.Now().Add(d)
	last := "operation not read yet"
	for {
		op, err := admin.GetOperation(ctx, name)
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("%d entries, %d Waiting", len(op.Status.Machines), countPhase(op, v1alpha1.OperationWaiting))
			if len(op.Status.Machines) == n && countPhase(op, v1alpha1.OperationWaiting) == n-1 {
				return last, nil
			}
		}
		if time.Now().After(deadline) {
			return last, fmt.Errorf("operation %s: not every target reported within %s: %s", name, d, last)
		}
		select {
		case <-ctx.Done():
			return last, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func countPhase(op *v1alpha1.MachineOperation, p v1alpha1.OperationPhase) int {
	c := 0
	for _, e := range op.Status.Machines {
		if e.Phase == p {
			c++
		}
	}
	return c
}
