package repave

// The probation of an upgraded release on the upgrade rig (upgrade_test.go): the verdict Succeeded comes after the
// upgrader's health gate, then the release stays on probation; a crash or a kill -9 on probation is rolled back by
// the recovery unit and reported on the operation, the Machine and in an Event; past the probation a kill -9 only
// restarts the watcher.

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/release"
	"github.com/kubeslot/kubeslot/lib/watcher"
	"github.com/kubeslot/kubeslot/units"
)

// probationBundles are the bundles the probation cases upgrade to: late's watcher exits 20 s after its start;
// byRelease holds, for each release name, a good bundle's URL, sha256 and version.
type probationBundles struct {
	late      [2]string
	byRelease map[string][3]string
}

// probationCases runs the probation subtests on r, whose current release is blue or green; verdict records the
// operation created -> Succeeded figure.
func (r *upRig) probationCases(t *testing.T, b probationBundles, verdictFigure func(time.Duration)) {
	ctx := r.ctx

	// setProbation sets the probation of the watchers started from now on, and restarts the watcher so that the
	// one running has it (a release whose watcher unit is unchanged re-executes in place, keeping its environment).
	setProbation := func(t *testing.T, d time.Duration) {
		t.Helper()
		if err := r.h.WriteFile("/etc/systemd/system/"+units.Watcher+".d/zz-test.conf", watcherDropIn(d), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := r.sd.ReloadContext(ctx); err != nil {
			t.Fatal(err)
		}
		r.run("systemctl", "restart", units.Watcher)
	}

	t.Run("CrashesOnProbationRolledBack", func(t *testing.T) {
		// The new watcher exits 20 s after its start: after the upgrader's 5 s health gate and the verdict, within
		// its 40 s probation. The recovery unit (started by the watcher's ExecStopPost=) rolls it back at its first
		// exit, and the old watcher reports that.
		setProbation(t, 40*time.Second)
		from, fromExe := r.current(), r.watcherExe()
		fromVersion := b.byRelease[from][2]
		t0 := time.Now()
		name := r.operation(b.late[0], b.late[1])
		res, _ := r.result(name, 3*time.Minute)
		if res.Phase != v1alpha1.OperationSucceeded {
			t.Fatalf("operation %+v: want Succeeded before the crash", res)
		}
		tSucceeded := time.Now()
		t.Logf("verdict Succeeded %s after creation", tSucceeded.Sub(t0).Round(time.Millisecond))
		if p, err := r.dir.ReadProbation(); err != nil || p == nil || p.ToVersion != "up-3" {
			t.Errorf("no probation of up-3 after the verdict: %+v %v", p, err)
		}
		r.rolledBackOnProbation(name, from, fromExe, fromVersion)
		// The crash comes 20 s after the new watcher's start, by the test hook: the figure is the kill -9 one below.
		t.Logf("rollback published %s after the verdict", time.Since(tSucceeded).Round(time.Millisecond))
		// The recovery unit again, as OnFailure= may run it: nothing changes.
		if res := r.start(units.Recovery); res != "done" {
			t.Errorf("recovery again: %s", res)
		}
		if c := r.current(); c != from {
			t.Errorf("current %s after a second recovery, want %s", c, from)
		}
		r.currentRuns()
	})

	t.Run("Kill9OnProbationRolledBack", func(t *testing.T) {
		// A good release, its watcher killed -9 right after it reported Succeeded: still on probation, so rolled
		// back, and reported.
		setProbation(t, 40*time.Second)
		from, fromExe := r.current(), r.watcherExe()
		to := map[string]string{"blue": "green", "green": "blue"}[from]
		url, sum := b.byRelease[to][0], b.byRelease[to][1]
		fromVersion := b.byRelease[from][2]
		t0 := time.Now()
		name := r.operation(url, sum)
		if res, _ := r.result(name, 3*time.Minute); res.Phase != v1alpha1.OperationSucceeded {
			t.Fatalf("operation %+v: want Succeeded", res)
		}
		verdictFigure(time.Since(t0))
		t.Logf("figure operation %s Succeeded %s after creation", name, time.Since(t0).Round(time.Millisecond))
		if c := r.current(); c != to {
			t.Fatalf("current %s after Succeeded, want %s", c, to)
		}
		tKill := time.Now()
		if err := r.sd.KillUnitWithTarget(ctx, units.Watcher, sddbus.Main, int32(syscall.SIGKILL)); err != nil {
			t.Fatal(err)
		}
		r.rolledBackOnProbation(name, from, fromExe, fromVersion)
		rig.Figures.Add("upgrade: kill -9 on probation to rollback published, old watcher back (recovery unit)", time.Since(tKill))
		t.Logf("figure recovery: rollback published, old watcher back %s after the kill -9", time.Since(tKill).Round(time.Millisecond))
		r.currentRuns()
	})

	t.Run("Kill9AfterProbationKept", func(t *testing.T) {
		// Past its probation a release is last-good: a watcher killed -9 then is restarted on it, not rolled back.
		setProbation(t, 3*time.Second)
		from := r.current()
		to := map[string]string{"blue": "green", "green": "blue"}[from]
		url, sum := b.byRelease[to][0], b.byRelease[to][1]
		t0 := time.Now()
		name := r.operation(url, sum)
		if res, _ := r.result(name, 3*time.Minute); res.Phase != v1alpha1.OperationSucceeded {
			t.Fatalf("operation %+v: want Succeeded", res)
		}
		verdictFigure(time.Since(t0))
		t.Logf("figure operation %s Succeeded %s after creation", name, time.Since(t0).Round(time.Millisecond))
		r.probationEnds(to)
		exe := r.watcherExe()
		pid := rig.ServiceProperty(t, ctx, r.sd, units.Watcher, "MainPID").(uint32)
		if err := r.sd.KillUnitWithTarget(ctx, units.Watcher, sddbus.Main, int32(syscall.SIGKILL)); err != nil {
			t.Fatal(err)
		}
		rig.Eventually(t, 60*time.Second, "the watcher restarted on "+to, func() (bool, string) {
			p := rig.ServiceProperty(t, ctx, r.sd, units.Watcher, "MainPID").(uint32)
			return p != 0 && p != pid && r.watcherExe() == exe, fmt.Sprintf("pid %d, exe %s", p, r.watcherExe())
		})
		if c := r.current(); c != to {
			t.Errorf("current %s after a kill past the probation, want %s", c, to)
		}
		op, err := r.admin.GetOperation(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if e := op.Status.Target(r.node, r.node); e == nil || e.RolledBack != nil {
			t.Errorf("entry %+v: want Succeeded without a rollback", e)
		}
		r.currentRuns()
	})
}

// probationEnds waits until the release rel passed its probation: last-good names it and the file is gone.
func (r *upRig) probationEnds(rel string) {
	r.t.Helper()
	rig.Eventually(r.t, 60*time.Second, "probation of "+rel+" ended", func() (bool, string) {
		lg, _ := release.LastGood(r.root)
		p, err := r.dir.ReadProbation()
		return lg == rel && p == nil && err == nil, fmt.Sprintf("last-good %s, probation %+v %v", lg, p, err)
	})
}

// rolledBackOnProbation checks that operation name, reported Succeeded, was rolled back while on probation: its
// entry keeps Succeeded and says rolledBack, current and last-good name release from again with its watcher
// running, the Machine's AgentUpgraded condition and a Warning Event say so, and the probation file is gone.
func (r *upRig) rolledBackOnProbation(name, from, fromExe, fromVersion string) {
	t := r.t
	t.Helper()
	var e *v1alpha1.MachineOperationTarget
	rig.Eventually(t, 2*time.Minute, "operation "+name+" shows the rollback", func() (bool, string) {
		op, err := r.admin.GetOperation(r.ctx, name)
		if err != nil {
			return false, err.Error()
		}
		e = op.Status.Target(r.node, r.node)
		return e != nil && e.RolledBack != nil, fmt.Sprintf("%+v", op.Status)
	})
	if e.Phase != v1alpha1.OperationSucceeded || e.RolledBack.Reason != v1alpha1.ReasonRolledBackOnProbation ||
		!strings.Contains(e.RolledBack.Message, "while on probation") || e.RolledBack.Time.IsZero() {
		t.Errorf("entry %+v, rolledBack %+v: want Succeeded kept, rolledBack RolledBackOnProbation", e, e.RolledBack)
	}
	t.Logf("operation entry: %s %q; rolledBack %s %q", e.Phase, e.Message, e.RolledBack.Reason, e.RolledBack.Message)
	if c := r.current(); c != from {
		t.Errorf("current %s, want %s", c, from)
	}
	if lg, _ := release.LastGood(r.root); lg != from {
		t.Errorf("last-good %s, want %s", lg, from)
	}
	rig.Eventually(t, 60*time.Second, "old watcher running", func() (bool, string) {
		exe := r.watcherExe()
		return exe == fromExe, exe
	})
	rig.Eventually(t, 30*time.Second, "Machine: AgentUpgraded False/RolledBackOnProbation, agent "+fromVersion, func() (bool, string) {
		m, err := r.admin.GetMachine(r.ctx, r.node)
		if err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.ConditionAgentUpgraded)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonRolledBackOnProbation &&
			m.Status.AgentVersion == fromVersion, fmt.Sprintf("%+v, agent %s", c, m.Status.AgentVersion)
	})
	cs, err := kubernetes.NewForConfig(r.cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	rig.Eventually(t, 30*time.Second, "Warning Event UpgradeRolledBack on the Machine", func() (bool, string) {
		l, err := cs.CoreV1().Events(watcher.EventNamespace).List(r.ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("involvedObject.name", r.node).String()})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, ev := range l.Items {
			if ev.InvolvedObject.Kind == "Machine" && ev.Reason == watcher.EventUpgradeRolledBack && ev.Type == corev1.EventTypeWarning &&
				strings.Contains(ev.Message, e.RolledBack.Message) {
				return true, ""
			}
			seen = append(seen, ev.Type+"/"+ev.Reason)
		}
		return false, strings.Join(seen, ",")
	})
	if p, err := r.dir.ReadProbation(); p != nil || err != nil {
		t.Errorf("probation file still there after the rollback was published: %+v %v", p, err)
	}
	if j := r.journal(units.Recovery); !strings.Contains(j, "rolled back while on probation") {
		t.Errorf("the recovery unit did not record a rollback on probation:\n%s", j)
	}
}
