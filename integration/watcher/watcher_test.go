package watcher

// The watcher stage on the rig: the real binary under its real unit in an isolated host, against the rig's control
// plane, acting as the node (system:node:<name>). The subtests run in order on one host, each building on the last.

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeslot/kubeslot/integration/kube"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/watcher"
	"github.com/kubeslot/kubeslot/units"
)

func TestWatcherOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	r := newWatcherRig(t, ctx, "wat")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("watcher journal:\n%s", r.journal())
		}
	})
	getMachine := func() *v1alpha1.Machine {
		m, err := r.admin.GetMachine(ctx, r.node)
		if err != nil {
			return nil
		}
		return m
	}
	t.Run("DeferredWhileInstallationIncomplete", func(t *testing.T) {
		if res := r.start(units.Watcher); res != "done" {
			t.Errorf("start job: %s, want done (exit %d is success)", res, exitcode.Deferred)
		}
		time.Sleep(time.Second) // several RestartSec=300ms: a restart, if any, would have happened
		want := fmt.Sprintf("ActiveState=inactive SubState=dead Result=success NRestarts=0 ExecMainStatus=%d", exitcode.Deferred)
		if got := rig.UnitState(t, ctx, r.sd, units.Watcher); got != want {
			t.Errorf("unit: %s, want %s", got, want)
		}
		if j := r.journal(); strings.Contains(j, "failed") || !strings.Contains(j, "deferred") {
			t.Errorf("want a deferral line and no error line in the journal:\n%s", j)
		}
	})

	r.complete()
	t.Run("StartsRegistersAndReports", func(t *testing.T) {
		t0 := time.Now()
		if res := r.start(units.Watcher); res != "done" {
			t.Fatalf("start job: %s", res)
		}
		rig.Timing(t, "watcher start -> READY", time.Since(t0))
		// The active slot's operator was asked for its hooks (slot a has no rootfs here, so nothing to repair).
		if j := r.journal(); !strings.Contains(j, "lifecycle hooks of the active slot ensured") {
			t.Errorf("no line saying the lifecycle hooks were ensured at start:\n%s", rig.TailLines(j, 30))
		}
		rig.Eventually(t, 30*time.Second, "Machine registered and reported Ready", func() (bool, string) {
			m := getMachine()
			if m == nil {
				return false, "no Machine"
			}
			return m.Spec.NodeName == r.node && m.Status.Phase == v1alpha1.MachineReady && m.Status.ActiveSlot == "a" &&
				m.Status.Applied != nil && string(m.Status.Applied.Fingerprint) == r.applied.Fingerprint(), fmt.Sprintf("%+v", m.Status)
		})
	})

	t.Run("WaitsOutABusyLock", func(t *testing.T) {
		// A watcher (re)started while another stage holds the installation lock past its wait must not defer
		// (exit 69 is never restarted: the host would be deaf to its Machine until the next boot). It waits in
		// rounds, alive for systemd, and starts when the lock frees.
		if err := r.h.WriteFile("/etc/systemd/system/"+units.Watcher+".d/zz-lockwait.conf",
			[]byte("[Service]\nEnvironment=KUBESLOT_WATCHER_LOCK_WAIT=3s\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		defer func() {
			_, _ = r.h.Run(ctx, "rm", "-f", "/etc/systemd/system/"+units.Watcher+".d/zz-lockwait.conf")
			r.run("systemctl", "daemon-reload")
		}()
		r.run("systemctl", "daemon-reload")
		r.run("systemd-run", "--unit=rig-lockholder", "--collect", "flock", "/run/kubeslot/install.lock", "sleep", "12")
		time.Sleep(500 * time.Millisecond)
		t0 := time.Now()
		r.run("systemctl", "restart", units.Watcher)
		time.Sleep(8 * time.Second) // two rounds of 3 s with the lock still held
		if got := rig.UnitState(t, ctx, r.sd, units.Watcher); !strings.HasPrefix(got, "ActiveState=active SubState=running") {
			t.Errorf("watcher while the lock is held: %s, want active and running", got)
		}
		pid := r.run("systemctl", "show", "-p", "MainPID", "--value", units.Watcher)
		if j := r.journal(); strings.Count(j, "installation lock still busy; waiting on") < 2 {
			t.Errorf("no rounds of waiting in the journal:\n%s", rig.TailLines(j, 20))
		}
		rig.Eventually(t, 30*time.Second, "watcher started after the lock freed", func() (bool, string) {
			j := r.journal()
			i := strings.LastIndex(j, "installation lock still busy; waiting on")
			return i >= 0 && strings.Contains(j[i:], "lifecycle hooks of the active slot ensured"), rig.TailLines(j, 5)
		})
		rig.Timing(t, "watcher restarted under a lock held 12 s -> started", time.Since(t0))
		if again := r.run("systemctl", "show", "-p", "MainPID", "--value", units.Watcher); again != pid {
			t.Errorf("watcher MainPID %s while waiting, %s after: it was restarted", pid, again)
		}
	})

	t.Run("SpecChangeGivesOneRepave", func(t *testing.T) {
		var lat []time.Duration
		var gen int64
		for i := 0; i < 5; i++ {
			gen = r.updateSpec(t, func(m *v1alpha1.Machine) {
				m.Spec.UpdatePolicy = v1alpha1.UpdateImmediate
				m.Spec.Node.KubernetesVersion = fmt.Sprintf("1.99.%d", i)
			})
			want := requests.NewID(requests.Repave, gen, "")
			d := rig.Eventually(t, 20*time.Second, "repave request "+want, func() (bool, string) {
				id := r.pendingID(requests.Repave)
				return id == want, id
			})
			lat = append(lat, d)
		}
		slices.Sort(lat)
		t.Logf("spec change -> request file: min %v median %v max %v over %d changes", lat[0], lat[len(lat)/2], lat[len(lat)-1], len(lat))
		rig.Figures.Add("watcher: spec change -> repave request (median)", lat[len(lat)/2])
		// A worker claims it; an update that changes no spec (a label) must not bring a second request.
		req := r.claim(requests.Repave)
		if req.Desired == nil || req.Desired.Kubernetes.Version != "1.99.4" || req.MachineGeneration != gen {
			t.Errorf("claimed request: %+v", req)
		}
		r.updateSpec(t, func(m *v1alpha1.Machine) { m.Labels = map[string]string{"touched": "yes"} })
		time.Sleep(2 * time.Second)
		if id := r.pendingID(requests.Repave); id != "" {
			t.Errorf("a second repave request %s after a no-op change", id)
		}
		// The repave "fails" (the fake worker says so): it is reported, and not requested again.
		if err := r.dir.WriteStatus(&requests.Status{RequestID: req.ID, Kind: requests.Repave, MachineGeneration: gen,
			Phase: requests.Failed, Message: "test: rootfs unreachable"}); err != nil {
			t.Fatal(err)
		}
		os.Remove(mustOK(r.dir.ClaimedPath(requests.Repave)))
		rig.Eventually(t, 20*time.Second, "Repaved=False on the Machine", func() (bool, string) {
			m := getMachine()
			c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.ConditionRepaved)
			return c != nil && c.Status == metav1.ConditionFalse && strings.Contains(c.Message, "rootfs unreachable"), fmt.Sprintf("%+v", c)
		})
		time.Sleep(time.Second)
		if id := r.pendingID(requests.Repave); id != "" {
			t.Errorf("failed repave requested again: %s", id)
		}
	})

	var restartOp string
	t.Run("NodeRestartOperation", func(t *testing.T) {
		// A short ttlSecondsAfterFinished: the watcher deletes the operation once it finished and that has passed.
		const ttl = 3
		ttlSeconds := int32(ttl)
		op := &v1alpha1.MachineOperation{Spec: v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationNodeRestart,
			MachineRef: &v1alpha1.MachineReference{Name: r.node}, TTLSecondsAfterFinished: &ttlSeconds}}
		op.Name = r.node + "-restart"
		other := &v1alpha1.MachineOperation{Spec: v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationNodeRestart,
			MachineRef: &v1alpha1.MachineReference{Name: r.node + "-other"}}}
		other.Name = r.node + "-other-restart"
		for _, o := range []*v1alpha1.MachineOperation{other, op} {
			if _, err := r.admin.CreateOperation(ctx, o); err != nil {
				t.Fatal(err)
			}
			name := o.Name
			t.Cleanup(func() { _ = r.admin.DeleteOperation(context.Background(), name) })
		}
		restartOp = op.Name
		var id string
		rig.Eventually(t, 20*time.Second, "restart request", func() (bool, string) {
			id = r.pendingID(requests.Restart)
			return strings.HasSuffix(id, "-"+op.Name), id
		})
		req := r.claim(requests.Restart)
		for _, ph := range []requests.Phase{requests.InProgress, requests.Succeeded} {
			if err := r.dir.WriteStatus(&requests.Status{RequestID: req.ID, Kind: requests.Restart, Operation: op.Name,
				MachineGeneration: req.MachineGeneration, Phase: ph, Message: "test worker: " + string(ph),
				Phases: []requests.PhaseTiming{{Name: "restart", StartedAt: time.Now().UTC()}}}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond)
		}
		var completed time.Time
		rig.Eventually(t, 20*time.Second, "operation entry Succeeded", func() (bool, string) {
			got, err := r.admin.GetOperation(ctx, op.Name)
			if err != nil {
				return false, err.Error()
			}
			e := got.Status.Target(r.node, r.node)
			if got.Status.CompletionTime != nil {
				completed = got.Status.CompletionTime.Time
			}
			return e != nil && e.Phase == v1alpha1.OperationSucceeded && got.Status.Phase == v1alpha1.OperationSucceeded &&
				got.Status.CompletionTime != nil, fmt.Sprintf("%+v", got.Status)
		})
		seen := time.Now()
		rig.Eventually(t, 30*time.Second, "finished operation deleted after its ttlSecondsAfterFinished", func() (bool, string) {
			_, err := r.admin.GetOperation(ctx, op.Name)
			return apierrors.IsNotFound(err), fmt.Sprint(err)
		})
		// completionTime has whole seconds: the delay after the expiry is measured to within a second.
		rig.Timing(t, fmt.Sprintf("watcher: operation Succeeded seen -> deleted (ttl %ds)", ttl), time.Since(seen))
		rig.Timing(t, "watcher: completionTime + ttl -> operation deleted (+/- 1 s)", time.Since(completed.Add(ttl*time.Second)))
		j := r.journal()
		if !slices.ContainsFunc(strings.Split(j, "\n"), func(l string) bool {
			return strings.Contains(l, "deleted a finished operation") && strings.Contains(l, op.Name)
		}) {
			t.Errorf("no journal line for the deletion of %s:\n%s", op.Name, rig.TailLines(j, 20))
		}
		if got, _ := r.admin.GetOperation(ctx, other.Name); got != nil && len(got.Status.Machines) > 0 {
			t.Errorf("operation for another machine got an entry: %+v", got.Status)
		}
		cs, err := kubernetes.NewForConfig(r.cp.AdminConfig())
		if err != nil {
			t.Fatal(err)
		}
		rig.Eventually(t, 20*time.Second, "Events on the Machine", func() (bool, string) {
			l, err := cs.CoreV1().Events(watcher.EventNamespace).List(ctx, metav1.ListOptions{
				FieldSelector: fields.OneTermEqualSelector("involvedObject.name", r.node).String()})
			if err != nil {
				return false, err.Error()
			}
			var reasons []string
			for _, e := range l.Items {
				if e.InvolvedObject.Kind == "Machine" && e.Type == corev1.EventTypeNormal {
					reasons = append(reasons, e.Reason)
				}
			}
			return slices.Contains(reasons, "RequestSucceeded"), strings.Join(reasons, ",")
		})
		os.Remove(mustOK(r.dir.ClaimedPath(requests.Restart)))
	})

	t.Run("Kill9RestartsWithoutDuplicates", func(t *testing.T) {
		before := r.svc("NRestarts").(uint32)
		pid := r.svc("MainPID").(uint32)
		t.Logf("watcher RSS before kill: %s", r.rss())
		r.run("systemctl", "kill", "--signal=SIGKILL", units.Watcher)
		rig.Eventually(t, 30*time.Second, "watcher restarted", func() (bool, string) {
			s := rig.UnitState(t, ctx, r.sd, units.Watcher)
			return r.svc("NRestarts").(uint32) > before && r.svc("MainPID").(uint32) != pid && strings.HasPrefix(s, "ActiveState=active"), s
		})
		time.Sleep(3 * time.Second)
		for _, k := range requests.Kinds() {
			if id := r.pendingID(k); id != "" {
				t.Errorf("request %s written again after kill -9", id)
			}
		}
		_ = restartOp
	})

	t.Run("Figures", func(t *testing.T) {
		// API requests other than watches while idle, from the apiserver's own counters (the test makes none).
		cs, err := kubernetes.NewForConfig(r.cp.AdminConfig())
		if err != nil {
			t.Fatal(err)
		}
		count := func() float64 {
			b, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var n float64
			for _, l := range strings.Split(string(b), "\n") {
				if !strings.HasPrefix(l, "apiserver_request_total{") || strings.Contains(l, `verb="WATCH"`) ||
					!(strings.Contains(l, `resource="machines"`) || strings.Contains(l, `resource="machineoperations"`)) {
					continue
				}
				var v float64
				fmt.Sscan(l[strings.LastIndex(l, " ")+1:], &v)
				n += v
			}
			return n
		}
		time.Sleep(2 * time.Second) // let the restart's first sync settle
		c0 := count()
		time.Sleep(15 * time.Second)
		idle := count() - c0
		t.Logf("Machine/MachineOperation API requests (not watches) in 15 s idle: %.0f", idle)
		fmt.Printf("rig: watcher idle API requests in 15 s: %.0f\n", idle)

		// Spec change -> request file, polled every 2 ms (p99 over 50 changes).
		const changes = 50
		var lat []time.Duration
		for i := 0; i < changes; i++ {
			t0 := time.Now()
			gen := r.updateSpec(t, func(m *v1alpha1.Machine) { m.Spec.Node.KubernetesVersion = fmt.Sprintf("1.98.%d", i) })
			want := requests.NewID(requests.Repave, gen, "")
			for r.pendingID(requests.Repave) != want {
				if time.Since(t0) > 20*time.Second {
					t.Fatalf("no request %s", want)
				}
				time.Sleep(2 * time.Millisecond)
			}
			lat = append(lat, time.Since(t0))
		}
		slices.Sort(lat)
		p50, p99 := percentile(lat, 0.50), percentile(lat, 0.99)
		t.Logf("spec update sent -> request file (%d changes): min %v p50 %v p99 %v max %v", changes, lat[0], p50, p99, lat[len(lat)-1])
		fmt.Printf("rig: watcher spec update -> request file over %d changes: p50 %.3fs p99 %.3fs\n", changes, p50.Seconds(), p99.Seconds())
		rig.Figures.Add(fmt.Sprintf("watcher: spec update -> request file, p50 of %d", changes), p50)
		rig.Figures.Add(fmt.Sprintf("watcher: spec update -> request file, p99 of %d", changes), p99)
		req := r.claim(requests.Repave)
		if err := r.dir.WriteStatus(&requests.Status{RequestID: req.ID, Kind: requests.Repave, MachineGeneration: req.MachineGeneration,
			Phase: requests.Succeeded, Message: "test worker"}); err != nil {
			t.Fatal(err)
		}
		os.Remove(mustOK(r.dir.ClaimedPath(requests.Repave)))
		t.Logf("watcher RSS: %s", r.rss())
	})

	t.Run("ReexecOnCurrentFlip", func(t *testing.T) {
		// An upgrade flips current; the watcher, started through the link by its unit, re-executes the binary
		// behind it in the same process: same PID, same invocation, no restart. Release green is a copy of blue's
		// watcher at another path, so /proc/PID/exe shows which one runs.
		exe := func(pid uint32) string {
			return strings.TrimSpace(r.run("readlink", fmt.Sprintf("/proc/%d/exe", pid)))
		}
		pid := r.svc("MainPID").(uint32)
		restarts := r.svc("NRestarts").(uint32)
		inv := fmt.Sprint(r.svc("InvocationID"))
		if before := exe(pid); !strings.Contains(before, "/releases/blue/") {
			t.Fatalf("watcher runs %s, want blue's binary", before)
		}
		r.run("sh", "-c", "mkdir -p /opt/kubeslot/releases/green && cp -a /opt/kubeslot/releases/blue/kubeslot-watcher /opt/kubeslot/releases/green/")
		t.Cleanup(func() { r.h.Run(ctx, "rm", "-rf", "/opt/kubeslot/releases/green") })
		flip := func(to string) {
			t.Helper()
			r.run("sh", "-c", "ln -sfn releases/"+to+" /opt/kubeslot/current.new && mv -T /opt/kubeslot/current.new /opt/kubeslot/current")
			t0 := time.Now()
			want := "/opt/kubeslot/releases/" + to + "/kubeslot-watcher"
			rig.Eventually(t, 30*time.Second, "watcher pid "+fmt.Sprint(pid)+" runs "+want, func() (bool, string) {
				out, err := r.h.Run(ctx, "readlink", fmt.Sprintf("/proc/%d/exe", pid))
				got := strings.TrimSpace(string(out))
				return err == nil && got == want, got
			})
			rig.Timing(t, "current flip -> watcher re-executed ("+to+")", time.Since(t0))
			if got := r.svc("MainPID").(uint32); got != pid {
				t.Errorf("MainPID %d -> %d: want the same process re-executed", pid, got)
			}
			if got := r.svc("NRestarts").(uint32); got != restarts {
				t.Errorf("NRestarts %d -> %d: the unit restarted instead of re-executing", restarts, got)
			}
			if got := fmt.Sprint(r.svc("InvocationID")); got != inv {
				t.Errorf("InvocationID changed: the unit was started again instead of re-executing")
			}
			if s := rig.UnitState(t, ctx, r.sd, units.Watcher); !strings.HasPrefix(s, "ActiveState=active") {
				t.Errorf("unit after re-exec: %s", s)
			}
		}
		flip("green")
		if j := r.journal(); !strings.Contains(j, "re-executing") {
			t.Errorf("no re-exec line in the watcher's journal:\n%s", j)
		}
		// Back, as a rollback does; the later subtests run on blue.
		flip("blue")
		t.Logf("watcher RSS after two re-execs: %s", r.rss())
		fmt.Printf("rig: watcher RSS %s\n", r.rss())
	})

	t.Run("UpgradeSignal", func(t *testing.T) {
		version := getMachine().Status.AgentVersion
		if version == "" {
			t.Fatal("the Machine reports no agent version")
		}
		// dispatch creates an AgentUpgrade operation and plays the upgrader up to the switch: claim the request,
		// report InProgress, finish the claim. The signal is what the test then writes.
		dispatch := func(t *testing.T, name string) *requests.Request {
			t.Helper()
			op := &v1alpha1.MachineOperation{Spec: v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationAgentUpgrade,
				MachineRef: &v1alpha1.MachineReference{Name: r.node},
				Parameters: &v1alpha1.OperationParameters{BundleURL: "https://example.invalid/kubeslot.tar.gz",
					BundleSHA256: v1alpha1.SHA256(strings.Repeat("ab", 32))}}}
			op.Name = name
			if _, err := r.admin.CreateOperation(ctx, op); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = r.admin.DeleteOperation(context.Background(), name) })
			rig.Eventually(t, 20*time.Second, "upgrade request", func() (bool, string) {
				id := r.pendingID(requests.Upgrade)
				return strings.HasSuffix(id, "-"+name), id
			})
			req := r.claim(requests.Upgrade)
			if req.Upgrade == nil || req.Operation != name {
				t.Fatalf("upgrade request %+v", req)
			}
			if err := r.dir.WriteStatus(&requests.Status{RequestID: req.ID, Kind: requests.Upgrade, Operation: name,
				MachineGeneration: req.MachineGeneration, Phase: requests.InProgress, Message: "test upgrader: switching",
				Phases: []requests.PhaseTiming{{Name: "download", StartedAt: time.Now().UTC()}}}); err != nil {
				t.Fatal(err)
			}
			os.Remove(mustOK(r.dir.ClaimedPath(requests.Upgrade)))
			return req
		}
		signal := func(req *requests.Request, to string) *requests.UpgradeSignal {
			return &requests.UpgradeSignal{RequestID: req.ID, Operation: req.Operation, MachineGeneration: req.MachineGeneration,
				// To the release current names: a probation whose release is not current is read as rolled back.
				FromRelease: "green", FromVersion: "v-old", ToRelease: "blue", ToVersion: to, SwitchedAt: time.Now().UTC(),
				Phases: []requests.PhaseTiming{{Name: "download", StartedAt: time.Now().UTC()}, {Name: "switch", StartedAt: time.Now().UTC()}}}
		}
		// finished waits for the operation's entry to reach phase with a message containing msg, the AgentUpgraded
		// condition to say so, and the signal to be gone.
		finished := func(t *testing.T, name string, phase v1alpha1.OperationPhase, msg string, cstatus metav1.ConditionStatus, reason string) time.Duration {
			t.Helper()
			d := rig.Eventually(t, 30*time.Second, "operation "+name+" "+string(phase), func() (bool, string) {
				got, err := r.admin.GetOperation(ctx, name)
				if err != nil {
					return false, err.Error()
				}
				e := got.Status.Target(r.node, r.node)
				return e != nil && e.Phase == phase && strings.Contains(e.Message, msg), fmt.Sprintf("%+v", got.Status)
			})
			rig.Eventually(t, 20*time.Second, "AgentUpgraded "+reason, func() (bool, string) {
				c := meta.FindStatusCondition(getMachine().Status.Conditions, v1alpha1.ConditionAgentUpgraded)
				return c != nil && c.Status == cstatus && c.Reason == reason && strings.Contains(c.Message, msg), fmt.Sprintf("%+v", c)
			})
			if s, err := r.dir.ReadUpgradeSignal(); err != nil || s != nil {
				t.Errorf("pending-upgrade signal after the result: %+v %v", s, err)
			}
			return d
		}

		t.Run("Failure", func(t *testing.T) {
			req := dispatch(t, r.node+"-upgrade-bad")
			s := signal(req, "v-new")
			s.Failure = "test: the new watcher exited 1; rolled back to blue"
			if err := r.dir.WriteUpgradeSignal(s); err != nil {
				t.Fatal(err)
			}
			finished(t, req.Operation, v1alpha1.OperationFailed, "rolled back to blue", metav1.ConditionFalse, v1alpha1.ReasonUpgradeFailed)
			st, err := r.dir.ReadStatus(req.ID)
			if err != nil || st.Phase != requests.Failed || len(st.Phases) != 2 {
				t.Errorf("final status %+v %v: want Failed with the signal's phases", st, err)
			}
		})

		t.Run("NotThisVersionWaits", func(t *testing.T) {
			// Verified for another version: this watcher is not the new release, so it must not decide.
			req := dispatch(t, r.node+"-upgrade-other")
			s := signal(req, "v-someone-else")
			s.Verified = true
			if err := r.dir.WriteUpgradeSignal(s); err != nil {
				t.Fatal(err)
			}
			time.Sleep(3 * time.Second)
			if got, err := r.dir.ReadUpgradeSignal(); err != nil || got == nil {
				t.Errorf("signal for another version consumed: %+v %v", got, err)
			}
			if st, err := r.dir.ReadStatus(req.ID); err != nil || st.Phase != requests.InProgress {
				t.Errorf("status %+v %v: want the upgrader's InProgress untouched", st, err)
			}
			// The recovery unit records the rollback: now it is final.
			s.Failure = "test: crashed after the upgrader exited; the recovery unit rolled back"
			if err := r.dir.WriteUpgradeSignal(s); err != nil {
				t.Fatal(err)
			}
			finished(t, req.Operation, v1alpha1.OperationFailed, "recovery unit rolled back", metav1.ConditionFalse, v1alpha1.ReasonUpgradeFailed)
		})

		t.Run("SuccessThenProbation", func(t *testing.T) {
			// A fresh watcher with a short probation, as after the upgrader restarted the unit.
			const settle = 4 * time.Second
			if err := r.h.WriteFile("/etc/systemd/system/"+units.Watcher+".d/zz-settle.conf",
				[]byte(fmt.Sprintf("[Service]\nEnvironment=KUBESLOT_WATCHER_UPGRADE_PROBATION=%s\n", settle)), 0o644); err != nil {
				t.Fatal(err)
			}
			r.run("systemctl", "daemon-reload")
			req := dispatch(t, r.node+"-upgrade-good")
			s := signal(req, version)
			if err := r.dir.WriteUpgradeSignal(s); err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			r.run("systemctl", "restart", units.Watcher)
			// Not verified yet: nothing happens, whatever the version.
			time.Sleep(time.Second)
			if got, err := r.dir.ReadUpgradeSignal(); err != nil || got == nil {
				t.Fatalf("unverified signal consumed: %+v %v", got, err)
			}
			s.Verified = true
			if err := r.dir.WriteUpgradeSignal(s); err != nil {
				t.Fatal(err)
			}
			d := finished(t, req.Operation, v1alpha1.OperationSucceeded, "agent upgraded from v-old to "+version,
				metav1.ConditionTrue, v1alpha1.ReasonUpgraded)
			rig.Timing(t, "watcher restart -> upgrade reported Succeeded", time.Since(t0))
			t.Logf("verified signal -> operation Succeeded: %v", d)
			if m := getMachine(); m.Status.AgentVersion != version {
				t.Errorf("Machine agentVersion %q, want %q", m.Status.AgentVersion, version)
			}
			// The release stays on probation until the watcher has been up for the window.
			rig.Eventually(t, 30*time.Second, "probation ended", func() (bool, string) {
				p, err := r.dir.ReadProbation()
				return p == nil && err == nil, fmt.Sprintf("%+v %v", p, err)
			})
			if since := time.Since(t0); since < settle {
				t.Errorf("probation ended %s after the watcher restart, before its %s window", since, settle)
			}
		})
	})

	t.Run("ClusterUnreachableAtStart", func(t *testing.T) {
		kc, err := r.h.ReadFile("/opt/kubeslot/identity/kubeconfig")
		if err != nil {
			t.Fatal(err)
		}
		ports, err := kube.FreePorts(1)
		if err != nil {
			t.Fatal(err)
		}
		closed := strings.Replace(string(kc), r.cp.URL(), fmt.Sprintf("https://127.0.0.1:%d", ports[0]), 1)
		if closed == string(kc) {
			t.Fatal("kubeconfig does not name the apiserver URL")
		}
		r.run("systemctl", "stop", units.Watcher)
		if err := r.h.WriteFile("/opt/kubeslot/identity/kubeconfig", []byte(closed), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := r.h.WriteFile("/etc/systemd/system/"+units.Watcher+".d/zz-ready.conf",
			[]byte("[Service]\nEnvironment=KUBESLOT_WATCHER_READY_AFTER=2s\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		r.run("systemctl", "daemon-reload")
		t0 := time.Now()
		if res := r.start(units.Watcher); res != "done" {
			t.Fatalf("start with the cluster unreachable: job %s", res)
		}
		rig.Timing(t, "watcher start, cluster unreachable -> READY", time.Since(t0))
		// While it cannot reach the cluster the spec moves on; nothing may be dispatched from what it saw before.
		gen := r.updateSpec(t, func(m *v1alpha1.Machine) {
			m.Spec.UpdatePolicy = v1alpha1.UpdateImmediate
			m.Spec.Node.KubernetesVersion = "1.99.7"
		})
		time.Sleep(3 * time.Second)
		if s := rig.UnitState(t, ctx, r.sd, units.Watcher); !strings.HasPrefix(s, "ActiveState=active") {
			t.Errorf("watcher without a cluster: %s, want it running", s)
		}
		if id := r.pendingID(requests.Repave); id != "" {
			t.Errorf("request %s dispatched while the cluster was unreachable", id)
		}
		t1 := time.Now()
		if err := r.h.WriteFile("/opt/kubeslot/identity/kubeconfig", kc, 0o600); err != nil {
			t.Fatal(err)
		}
		want := requests.NewID(requests.Repave, gen, "")
		rig.Eventually(t, 60*time.Second, "repave "+want+" after the cluster came back", func() (bool, string) {
			id := r.pendingID(requests.Repave)
			return id == want, id
		})
		rig.Timing(t, "kubeconfig restored -> request for the current spec", time.Since(t1))
		req := r.claim(requests.Repave)
		if err := r.dir.WriteStatus(&requests.Status{RequestID: req.ID, Kind: requests.Repave, MachineGeneration: gen,
			Phase: requests.Succeeded, Message: "test worker"}); err != nil {
			t.Fatal(err)
		}
		os.Remove(mustOK(r.dir.ClaimedPath(requests.Repave)))
	})

	t.Run("InvalidSpecDegraded", func(t *testing.T) {
		// The schema accepts this label; the agent's own check does not (the kubelet may not set it on its Node).
		const key = "node-role.kubernetes.io/worker"
		gen := r.updateSpec(t, func(m *v1alpha1.Machine) {
			m.Spec.Node.Labels = map[string]v1alpha1.LabelValue{key: "x"}
			m.Spec.Node.KubernetesVersion = "1.99.8"
		})
		rig.Eventually(t, 20*time.Second, "Degraded InvalidSpec naming the field", func() (bool, string) {
			m := getMachine()
			c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.ConditionDegraded)
			return c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonInvalidSpec &&
				strings.Contains(c.Message, "spec.node.labels") && strings.Contains(c.Message, key) &&
				m.Status.Phase == v1alpha1.MachineDegraded, fmt.Sprintf("%+v", c)
		})
		time.Sleep(time.Second)
		if id := r.pendingID(requests.Repave); id != "" {
			t.Errorf("repave %s dispatched from an invalid spec (generation %d)", id, gen)
		}
		m := getMachine()
		t.Logf("Degraded: %s", meta.FindStatusCondition(m.Status.Conditions, v1alpha1.ConditionDegraded).Message)
	})

	t.Run("GPUsTheHostDoesNotOfferDegraded", func(t *testing.T) {
		// A Machine editor asks for the host's GPUs; this host's configuration neither sets gpus nor allows
		// /dev/nvidiactl.
		gen := r.updateSpec(t, func(m *v1alpha1.Machine) {
			m.Spec.Node.Labels = nil
			m.Spec.Node.Devices = &v1alpha1.Devices{GPUs: v1alpha1.GPUsNVIDIA}
		})
		rig.Eventually(t, 20*time.Second, "Degraded InvalidSpec naming spec.node.devices.gpus", func() (bool, string) {
			m := getMachine()
			c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.ConditionDegraded)
			return c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonInvalidSpec &&
				strings.Contains(c.Message, `spec.node.devices.gpus = "NVIDIA"`) && strings.Contains(c.Message, "/dev/nvidiactl"), fmt.Sprintf("%+v", c)
		})
		time.Sleep(time.Second)
		if id := r.pendingID(requests.Repave); id != "" {
			t.Errorf("repave %s dispatched for GPUs the host does not offer (generation %d)", id, gen)
		}
	})

	t.Run("CorruptAppliedConfigRefuses", func(t *testing.T) {
		p := mustOK(r.root.Path("applied", "a.json"))
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, append(b, ' '), 0o600); err != nil {
			t.Fatal(err)
		}
		gen := r.updateSpec(t, func(m *v1alpha1.Machine) { m.Spec.Node.KubernetesVersion = "1.99.9" })
		rig.Eventually(t, 30*time.Second, "Degraded condition naming the applied config", func() (bool, string) {
			m := getMachine()
			c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.ConditionDegraded)
			return c != nil && c.Status == metav1.ConditionTrue && c.Reason == watcher.ReasonAppliedCorrupt &&
				strings.Contains(c.Message, "a.json"), fmt.Sprintf("%+v", c)
		})
		time.Sleep(time.Second)
		if id := r.pendingID(requests.Repave); id != "" {
			t.Errorf("repave %s dispatched from a corrupt applied config (generation %d)", id, gen)
		}
	})
}

// percentile of sorted durations (nearest rank).
func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func mustOK[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
