package soak

// TestSoak (`make soak`): a chaos test on one rig host. Each round runs one operation as an operator would
// ask for it: a spec repave (a node label changed on the Machine, updatePolicy Immediate), a NodeRestart operation,
// an AgentUpgrade operation to a newer bundle, or an AgentReset operation followed by a fresh bootstrap of the same
// host. During it a random kubeslot process (the watcher, a worker, the resetter, whatever runs at that moment) is
// killed with SIGKILL at a random moment, and in some rounds the host loses power (sdhost Kill + Boot, the disk
// kept). Nobody helps afterwards: each round ends when the host's invariants hold again by themselves, within a
// bound:
//
//   - the node runs on the slot applied/active names: exactly one node machine, that slot's, its Node Ready with a
//     fresh Lease;
//   - the Machine's status is true: that slot, phase Ready, observedGeneration = generation, the applied
//     configuration's fingerprint, the agent version the current release reports;
//   - no request is stuck: requests/ empty, no claimed request, no interrupted repave, every status file finished,
//     no worker running;
//   - the operation ended as it must (see soakAccept).
//
// The last step is an AgentReset that leaves the host clean; TestMain's leak check then compares the machine with
// its first snapshot. A table of the rounds (operation, kill point, power cut, operation result, recovery time,
// result) is printed at the end.
//
// Environment:
//
//	KUBESLOT_SOAK_ROUNDS=N  run N rounds; without it the test is skipped (so `make test` does not run it)
//	KUBESLOT_SOAK_SEED=S    the seed of the random plan (printed at the start; default: the clock)
//
// In reset rounds the power cut falls in the reset (finished at boot by kubeslot-resetting.service) or in the
// bootstrap that follows it.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/units"
)

const (
	envSoakRounds = "KUBESLOT_SOAK_ROUNDS"
	envSoakSeed   = "KUBESLOT_SOAK_SEED"
	soakLabel     = "kubeslot.dev/soak"
	soakBase      = "/opt/kubeslot"
)

type soakOp string

const (
	soakRepave  soakOp = "repave"
	soakRestart soakOp = "restart"
	soakUpgrade soakOp = "upgrade"
	soakReset   soakOp = "reset+bootstrap"
)

var soakOps = []soakOp{soakRepave, soakRestart, soakUpgrade, soakReset}

// soakWindow is how long after the start of each operation the watcher's kill and the power cut may come: about
// the time the operation takes on the rig, so that most disruptions land while it runs. In reset rounds the power
// cut comes within the reset's window or, past it, within soakBootstrapWindow of the start of the bootstrap that
// follows (soakPlan.cutInReset).
var soakWindow = map[soakOp]time.Duration{
	soakRepave:  20 * time.Second,
	soakRestart: 10 * time.Second,
	soakUpgrade: 15 * time.Second,
	soakReset:   8 * time.Second,
}

// soakWorker is the unit of each operation's worker, and soakWorkerWindow how long after it started running its
// kill may come: a little less than its run on the rig, so that most kills hit it at work.
var (
	soakWorker = map[soakOp]string{
		soakRepave:  "kubeslot-repave@next.service",
		soakRestart: "kubeslot-restart.service",
		soakUpgrade: "kubeslot-upgrade.service",
		soakReset:   units.Resetting, // kubeslot-reset.service only hands the request over to it
	}
	soakWorkerWindow = map[soakOp]time.Duration{
		soakRepave:  5 * time.Second,
		soakRestart: 2500 * time.Millisecond,
		soakUpgrade: 6 * time.Second,
		soakReset:   5 * time.Second,
	}
)

const soakBootstrapWindow = 20 * time.Second

// soakPlan is one round, drawn from the seed before the first round runs.
type soakPlan struct {
	op soakOp
	// killWorker: the kill is for the operation's worker, killAt after it is first seen running; else for the
	// watcher, killAt after the start of the operation.
	killWorker bool
	killAt     time.Duration
	cut        bool
	cutAt      time.Duration // after the start of the operation (reset rounds: see cutInReset)
}

// cutInReset: in a reset round, the power cut falls in the reset, at cutAt; else in the bootstrap that follows, at
// cutAt minus the reset's window after its start.
func (p soakPlan) cutInReset() bool { return p.op == soakReset && p.cutAt < soakWindow[soakReset] }

// soakPlans draws n rounds from seed: the four operations in a random order in every block of four rounds (so any
// four rounds in a row from the start cover them all), one power cut in a random round of each block, the kill for
// the worker in three rounds out of four (else for the watcher), and the moments uniformly within their windows, in
// tenths of a second.
func soakPlans(seed uint64, n int) []soakPlan {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	moment := func(w time.Duration) time.Duration {
		return time.Duration(rng.Int64N(int64(w/(100*time.Millisecond))+1)) * 100 * time.Millisecond
	}
	var plans []soakPlan
	for len(plans) < n {
		block := slices.Clone(soakOps)
		rng.Shuffle(len(block), func(i, j int) { block[i], block[j] = block[j], block[i] })
		cut := rng.IntN(len(block))
		for i, op := range block {
			p := soakPlan{op: op, killWorker: rng.IntN(4) != 0, cut: i == cut}
			if p.killWorker {
				p.killAt = moment(soakWorkerWindow[op])
			} else {
				p.killAt = moment(soakWindow[op])
			}
			if op == soakReset {
				p.cutAt = moment(soakWindow[op] + soakBootstrapWindow)
			} else {
				p.cutAt = moment(soakWindow[op])
			}
			plans = append(plans, p)
		}
	}
	return plans[:n]
}

func (p soakPlan) String() string {
	cut := "no power cut"
	if p.cut {
		cut = fmt.Sprintf("power cut at +%.1fs", p.cutAt.Seconds())
		switch {
		case p.cutInReset():
			cut += " of the reset"
		case p.op == soakReset:
			cut = fmt.Sprintf("power cut at +%.1fs of the bootstrap", (p.cutAt - soakWindow[soakReset]).Seconds())
		}
	}
	kill := fmt.Sprintf("kill -9 of the watcher at +%.1fs", p.killAt.Seconds())
	if p.killWorker {
		kill = fmt.Sprintf("kill -9 of %s %.1fs after it started", strings.TrimSuffix(soakWorker[p.op], ".service"), p.killAt.Seconds())
	}
	return fmt.Sprintf("%s, %s, %s", p.op, kill, cut)
}

// soakRow is one line of the table.
type soakRow struct {
	n        int
	op       soakOp
	kill     string
	killed   string // the unit of the process killed
	cut      string
	opResult string
	recovery time.Duration
	result   string
}

type soak struct {
	t   *testing.T
	ctx context.Context
	r   *rig.RepaveRig
	// version is the agent version the host must run; label the value of soakLabel its Node must carry ("" after a
	// fresh bootstrap).
	version string
	label   string
	// bundles: version → URL and sha256 of an upgrade bundle on the rig's mirror.
	bundles map[string][2]string
	rows    []soakRow
}

func TestSoak(t *testing.T) {
	n, err := strconv.Atoi(os.Getenv(envSoakRounds))
	if os.Getenv(envSoakRounds) == "" {
		t.Skipf("the soak runs only when asked for: %s=N (make soak)", envSoakRounds)
	}
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a number of rounds >= 1", envSoakRounds, os.Getenv(envSoakRounds))
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(envSoakSeed); v != "" {
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", envSoakSeed, v, err)
		}
	}
	plans := soakPlans(seed, n)
	fmt.Printf("soak: seed %d (replay the plan: %s=%d), %d rounds\n", seed, envSoakSeed, seed, n)
	for i, p := range plans {
		fmt.Printf("soak: plan round %d: %s\n", i+1, p)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute+time.Duration(n)*10*time.Minute)
	defer cancel()

	// Two releases to upgrade to, back and forth: built before the host boots (a minute or two, cached after).
	bins1, bins2 := rig.BuildRelease(t, "soak-1"), rig.BuildRelease(t, "soak-2")
	s := &soak{t: t, ctx: ctx, version: "devel", bundles: map[string][2]string{}}
	s.r = rig.NewRepaveRigWith(t, ctx, "soak", rig.Options{Persistent: true})
	for v, bins := range map[string]string{"soak-1": bins1, "soak-2": bins2} {
		p, _ := rig.MakeUpgradeBundle(t, bins, v)
		sum, err := s.r.Srv.Add("kubeslot-"+v+".tar.gz", p)
		if err != nil {
			t.Fatal(err)
		}
		s.bundles[v] = [2]string{s.r.Srv.URL("kubeslot-" + v + ".tar.gz"), sum}
	}
	defer s.table(seed)

	t0 := time.Now()
	if bad := s.waitHealthy(3 * time.Minute); bad != nil {
		t.Fatalf("the bootstrapped host is not healthy before the first round:\n  %s\n%s", strings.Join(bad, "\n  "), s.journals())
	}
	fmt.Printf("soak: host healthy after its bootstrap (%s more for the Machine)\n", secs(time.Since(t0)))

	for i, p := range plans {
		fmt.Printf("soak: round %d: %s\n", i+1, p)
		row := s.round(i+1, p)
		s.rows = append(s.rows, row)
		fmt.Printf("soak: round %d: %s, kill %s, power cut %s, operation %s, recovery %s: %s\n", row.n, row.op, row.kill,
			row.cut, row.opResult, secs(row.recovery), row.result)
		if row.result != "ok" {
			t.Errorf("round %d (%s) failed: %s\n%s", row.n, p, row.result, s.journals())
			return // the host is not what the next round needs; the rig's clean-up stops it
		}
	}
	s.finalReset()
}

// round runs one planned round and returns its row.
func (s *soak) round(n int, p soakPlan) soakRow {
	row := soakRow{n: n, op: p.op, cut: "no", kill: "-"}
	opName := fmt.Sprintf("%s-r%d-%s", s.r.Node, n, strings.TrimSuffix(string(p.op), "+bootstrap"))
	// What the operation must change, seen from outside kubeslot: a repave the slot, a restart the kubelet's
	// invocation inside the node (a restart in place keeps a serving machine and restarts containerd and the
	// kubelet in it; any other node's machine is restarted, and its kubelet with it).
	slotBefore := s.activeSlot()
	invBefore := s.invocation("systemd-nspawn@" + slotBefore + ".service")
	kubeletBefore := s.kubeletInvocation(slotBefore)
	t0 := time.Now()
	var done func() (bool, string, string) // finished, detail while waiting, failure ("" when as expected)
	switch p.op {
	case soakRepave:
		label := strconv.Itoa(n)
		gen := s.r.UpdateMachine(s.ctx, func(m *v1alpha1.Machine) {
			if m.Spec.Node.Labels == nil {
				m.Spec.Node.Labels = map[string]v1alpha1.LabelValue{}
			}
			m.Spec.Node.Labels[soakLabel] = v1alpha1.LabelValue(label)
			m.Spec.UpdatePolicy = v1alpha1.UpdateImmediate
		})
		id := requests.NewID(requests.Repave, gen, "")
		done = func() (bool, string, string) {
			st := s.status(id)
			if st == nil || !st.Phase.Finished() {
				return false, fmt.Sprintf("status %s: %+v", id, st), ""
			}
			row.opResult = fmt.Sprintf("%s onto %s in %s", st.Phase, st.ActiveSlot, secs(time.Since(t0)))
			if st.Phase != requests.Succeeded {
				return true, "", "spec repave " + string(st.Phase) + ": " + st.Message
			}
			if now := s.activeSlot(); now == slotBefore {
				return true, "", "spec repave Succeeded, but applied/active still names slot " + now
			}
			s.label = label
			return true, "", ""
		}
	case soakRestart:
		s.createOp(opName, v1alpha1.OperationNodeRestart, nil)
		opDone := s.opDone(opName, t0, &row, nil)
		done = func() (bool, string, string) {
			ok, detail, fail := opDone()
			if ok && fail == "" {
				machine := s.invocation("systemd-nspawn@"+slotBefore+".service") != invBefore
				kubelet := s.kubeletInvocation(slotBefore)
				switch {
				case machine:
					row.opResult += " (machine restarted)"
				case kubelet != "" && kubelet != kubeletBefore:
					row.opResult += " (kubelet restarted in the running machine)"
				default:
					fail = fmt.Sprintf("NodeRestart Succeeded, but neither systemd-nspawn@%s nor the kubelet in it was started again (kubelet invocation %q before, %q after)",
						slotBefore, kubeletBefore, kubelet)
				}
			}
			return ok, detail, fail
		}
	case soakUpgrade:
		to := "soak-1"
		if s.version == to {
			to = "soak-2"
		}
		b := s.bundles[to]
		s.createOp(opName, v1alpha1.OperationAgentUpgrade, &v1alpha1.OperationParameters{BundleURL: v1alpha1.URL(b[0]), BundleSHA256: v1alpha1.SHA256(b[1])})
		from := s.version
		disrupted := func() bool { return row.killed == units.Watcher || row.cut != "no" }
		opDone := s.opDone(opName, t0, &row, func(e *v1alpha1.MachineOperationTarget) string {
			// A watcher killed after the verdict, while the release is on probation, is rolled back by the
			// recovery unit: Succeeded stays, with the rollback beside it.
			if e.Phase == v1alpha1.OperationSucceeded && e.RolledBack != nil {
				s.version = from
				if !disrupted() {
					return "AgentUpgrade Succeeded, then rolled back undisturbed: " + e.RolledBack.Message
				}
				return ""
			}
			if e.Phase == v1alpha1.OperationSucceeded {
				s.version = to
				return ""
			}
			// A watcher killed (or powered off) while the upgrader's health gate watches it is an unhealthy new
			// release by design: the upgrade rolls back and says so (or the recovery unit does, "recovered to").
			// Anything else is a failure.
			if disrupted() && (strings.Contains(e.Message, "rolled back") || strings.Contains(e.Message, "recovered to")) {
				s.version = from
				return ""
			}
			return "AgentUpgrade " + string(e.Phase) + ": " + e.Message
		})
		done = func() (bool, string, string) {
			ok, detail, fail := opDone()
			// After a watcher kill, a Succeeded release may still be on probation and about to be rolled back:
			// the round ends once its probation ended or the rollback was published (the file is gone).
			if ok && fail == "" && row.killed == units.Watcher {
				if _, err := s.r.H.Run(s.ctx, "test", "-e", "/opt/kubeslot/state/upgrade-probation.json"); err == nil {
					return false, "the release is on probation", ""
				}
				ok, detail, fail = opDone() // the rollback, if one came, is on the entry by now
			}
			return ok, detail, fail
		}
	case soakReset:
		s.createOp(opName, v1alpha1.OperationAgentReset, nil)
		opDone := s.opDone(opName, t0, &row, nil)
		done = func() (bool, string, string) {
			ok, detail, fail := opDone()
			if !ok || fail != "" {
				return ok, detail, fail
			}
			return s.resetDone()
		}
	}

	last := s.disrupt(t0, p, &row)

	if fail := s.waitDone(done, 8*time.Minute); fail != "" {
		row.result = "FAIL: " + fail
		return row
	}
	if p.op == soakReset {
		// A node that rejoins: the operator deletes the old Machine and Node, as after a decommission, and lays down
		// what Ignition would (a fresh join token); the first-boot unit bootstraps the host.
		cut, cutAt, fail := s.rebootstrap(p)
		if !p.cutInReset() {
			row.cut = cut
		}
		if fail != "" {
			row.result = "FAIL: " + fail
			return row
		}
		if !cutAt.IsZero() {
			last = cutAt
		}
	}
	if bad := s.waitHealthy(5 * time.Minute); bad != nil {
		row.result = "FAIL: invariants do not hold after 5m: " + strings.Join(bad, "; ")
		return row
	}
	row.recovery = time.Since(last)
	if p.op != soakRepave {
		_ = s.r.MC.DeleteOperation(s.ctx, opName)
	}
	row.result = "ok"
	return row
}

// createOp creates an operation of type typ for the rig's Machine.
func (s *soak) createOp(name string, typ v1alpha1.OperationType, params *v1alpha1.OperationParameters) {
	s.t.Helper()
	op := &v1alpha1.MachineOperation{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.MachineOperationSpec{Type: typ, MachineRef: &v1alpha1.MachineReference{Name: s.r.Node}, Parameters: params}}
	if _, err := s.r.MC.CreateOperation(s.ctx, op); err != nil {
		s.t.Fatalf("create %s operation %s: %v", typ, name, err)
	}
	s.t.Cleanup(func() { _ = s.r.MC.DeleteOperation(context.Background(), name) })
}

// opDone says when the operation's entry for the Machine is finished. accept judges a finished entry ("" when it
// ended as it must); nil accepts Succeeded only.
func (s *soak) opDone(name string, t0 time.Time, row *soakRow, accept func(*v1alpha1.MachineOperationTarget) string) func() (bool, string, string) {
	return func() (bool, string, string) {
		op, err := s.r.MC.GetOperation(s.ctx, name)
		if err != nil {
			return false, err.Error(), ""
		}
		e := op.Status.Target(s.r.Node, s.r.Node)
		if e == nil || !e.Phase.Finished() {
			return false, fmt.Sprintf("operation %s: %+v", name, e), ""
		}
		if row.opResult == "" { // the first time it is seen finished
			row.opResult = fmt.Sprintf("%s in %s", e.Phase, secs(time.Since(t0)))
			if e.Phase == v1alpha1.OperationFailed {
				row.opResult += " (" + firstLineOf(e.Message) + ")"
			}
		}
		if accept != nil {
			return true, "", accept(e)
		}
		if e.Phase != v1alpha1.OperationSucceeded {
			return true, "", string(e.Phase) + ": " + e.Message
		}
		return true, "", ""
	}
}

// waitDone polls done until the operation finished, bounded; it returns why the round failed ("" when it did not).
func (s *soak) waitDone(done func() (bool, string, string), bound time.Duration) string {
	deadline := time.Now().Add(bound)
	last := ""
	for time.Now().Before(deadline) && s.ctx.Err() == nil {
		ok, detail, fail := done()
		if ok {
			return fail
		}
		last = detail
		sleepUntil(s.ctx, time.Now().Add(time.Second))
	}
	return fmt.Sprintf("the operation did not finish within %s (last: %s)", bound, last)
}

// resetDone: the host root and the resetting unit are gone, and no reset unit runs.
func (s *soak) resetDone() (bool, string, string) {
	_, err := s.r.H.Run(s.ctx, "test", "-e", soakBase)
	_, uerr := s.r.H.Run(s.ctx, "test", "-e", "/etc/systemd/system/"+units.Resetting)
	st, rst := s.unitState("kubeslot-reset.service"), s.unitState(units.Resetting)
	return err != nil && uerr != nil && !soakBusy(st) && !soakBusy(rst),
		fmt.Sprintf("%s exists %v, %s exists %v, kubeslot-reset.service %s, %s %s", soakBase, err == nil, units.Resetting, uerr == nil, st, units.Resetting, rst), ""
}

// disrupt carries out the round's kill and power cut (in reset rounds only one that falls in the reset, see
// rebootstrap), each at its moment,
// and returns the time of the last one. A worker's kill waits (bounded) until the worker runs, and then until its
// moment; a worker that has exited by then is missed, and the table says so.
func (s *soak) disrupt(t0 time.Time, p soakPlan, row *soakRow) time.Time {
	last := t0
	cutPending, killPending := p.cut && (p.op != soakReset || p.cutInReset()), true
	var killTime, workerSeen time.Time
	target := units.Watcher
	if p.killWorker {
		target = soakWorker[p.op]
	} else {
		killTime = t0.Add(p.killAt)
	}
	seenBy := t0.Add(90 * time.Second)
	for (cutPending || killPending) && s.ctx.Err() == nil {
		now := time.Now()
		switch {
		case cutPending && !now.Before(t0.Add(p.cutAt)):
			row.cut, cutPending, last = s.powerCut(p.cutAt), false, now
			continue
		case killPending && killTime.IsZero():
			if s.mainPID(target) != "" {
				workerSeen = now
				killTime = now.Add(p.killAt)
			} else if now.After(seenBy) {
				row.kill, killPending = "missed: "+strings.TrimSuffix(target, ".service")+" never seen running", false
				continue
			}
		case killPending && !now.Before(killTime):
			moment := fmt.Sprintf("+%.1fs", now.Sub(t0).Seconds())
			if p.killWorker {
				moment = fmt.Sprintf("%.1fs after start, %s", now.Sub(workerSeen).Seconds(), moment)
			}
			row.kill, row.killed = s.killUnit(target, moment)
			killPending, last = false, now
			continue
		}
		sleepUntil(s.ctx, now.Add(100*time.Millisecond))
	}
	return last
}

// mainPID is the main PID of a unit in the host ("" when it has none: not running, or in ExecStopPost).
func (s *soak) mainPID(unit string) string {
	out, err := s.r.H.Run(s.ctx, "systemctl", "show", "-p", "MainPID", "--value", unit)
	if pid := strings.TrimSpace(string(out)); err == nil && pid != "0" && pid != "" {
		return pid
	}
	return ""
}

// killUnit sends SIGKILL to the main process of unit, if it runs a kubeslot binary; it says what it killed, and
// returns the unit ("" when it missed); moment describes when, for the table.
func (s *soak) killUnit(unit, moment string) (string, string) {
	short := strings.TrimSuffix(strings.TrimPrefix(unit, "kubeslot-"), ".service")
	pid := s.mainPID(unit)
	if pid == "" {
		return fmt.Sprintf("missed: %s not running %s", short, moment), ""
	}
	// Only a kubeslot binary is killed: the PID's executable is checked in the same shell that kills it.
	out, err := s.r.H.Run(s.ctx, "sh", "-c", `e=$(readlink /proc/$1/exe) && e=$(basename "${e% (deleted)}") && `+
		`case "$e" in kubeslot*) kill -9 "$1" && echo "$e";; *) echo "not kubeslot: $e"; exit 1;; esac`, "sh", pid)
	what := strings.TrimSpace(string(out))
	if err != nil {
		return fmt.Sprintf("missed: %s pid %s (%s) %s", short, pid, what, moment), ""
	}
	return fmt.Sprintf("%s (%s) %s", what, short, moment), unit
}

// powerCut kills the host (its disk kept) and boots it again; at is the moment in the round.
func (s *soak) powerCut(at time.Duration) string {
	s.t.Helper()
	if err := s.r.H.Kill(); err != nil {
		s.t.Fatalf("power cut: %v", err)
	}
	t0 := time.Now()
	if err := s.r.H.Boot(s.ctx); err != nil {
		s.t.Fatalf("boot after the power cut: %v", err)
	}
	took := time.Since(t0)
	if took > 5*time.Second {
		// What held the boot up (sdhost waits until systemd reports the boot finished: every queued job done).
		out, _ := s.r.H.Run(s.ctx, "sh", "-c", "systemd-analyze blame --no-pager | head -4; "+
			"journalctl -b --no-pager -q -o short-precise _SYSTEMD_UNIT=kubeslot-bootstrap.service + _SYSTEMD_UNIT=kubeslot-restart.service + "+
			"_SYSTEMD_UNIT=kubeslot-repave@next.service + _SYSTEMD_UNIT=kubeslot-upgrade.service | cut -c1-240 | tail -25")
		fmt.Printf("soak: boot after the power cut took %s; systemd-analyze blame and the workers' journal of this boot:\n%s", secs(took), out)
	}
	return fmt.Sprintf("+%.1fs (boot %s)", at.Seconds(), secs(took))
}

// rebootstrap makes the reset host a node again, with the power cut of the plan during the bootstrap; it returns
// the power cut's description and moment, and why it failed ("" when it did not).
func (s *soak) rebootstrap(p soakPlan) (cut string, cutAt time.Time, fail string) {
	r := s.r
	cut = "no"
	if err := r.MC.DeleteMachine(s.ctx, r.Node); err != nil && !apierrors.IsNotFound(err) {
		return cut, cutAt, "delete the Machine: " + err.Error()
	}
	if err := r.Admin.CoreV1().Nodes().Delete(s.ctx, r.Node, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return cut, cutAt, "delete the Node: " + err.Error()
	}
	var err error
	if r.Token, err = r.CP.CreateBootstrapToken(s.ctx, 30*time.Minute); err != nil {
		return cut, cutAt, "bootstrap token: " + err.Error()
	}
	r.LayDown(s.ctx)
	r.SeedCache(s.ctx)
	t0 := time.Now()
	if out, err := r.H.Run(s.ctx, "systemctl", "start", "--no-block", units.Bootstrap); err != nil {
		return cut, cutAt, fmt.Sprintf("start %s: %v %s", units.Bootstrap, err, out)
	}
	if p.cut && !p.cutInReset() {
		at := p.cutAt - soakWindow[soakReset]
		sleepUntil(s.ctx, t0.Add(at))
		cutAt = time.Now()
		cut = s.powerCut(at) + " of the bootstrap"
	}
	deadline := time.Now().Add(6 * time.Minute)
	for {
		st := s.unitState(units.Bootstrap)
		if strings.HasPrefix(st, "active") {
			break
		}
		if strings.HasPrefix(st, "failed") || time.Now().After(deadline) || s.ctx.Err() != nil {
			return cut, cutAt, fmt.Sprintf("the first-boot unit did not complete (%s)", st)
		}
		sleepUntil(s.ctx, time.Now().Add(500*time.Millisecond))
	}
	r.WorkerDropIns(s.ctx)
	s.version, s.label = "devel", ""
	return cut, cutAt, ""
}

// activeSlot is what applied/active names ("" when unreadable).
func (s *soak) activeSlot() string {
	b, err := s.r.H.ReadFile(soakBase + "/applied/active")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// invocation is the InvocationID of a unit in the host: a new one for every start.
func (s *soak) invocation(unit string) string {
	out, _ := s.r.H.Run(s.ctx, "systemctl", "show", "-p", "InvocationID", "--value", unit)
	return strings.TrimSpace(string(out))
}

// kubeletInvocation is the invocation ID of the kubelet's unit inside slot's node machine ("" when it cannot be read).
func (s *soak) kubeletInvocation(slot string) string {
	out, _ := s.r.H.Run(s.ctx, "systemctl", "-M", slot, "show", "-p", "InvocationID", "--value", nodeconfig.KubeletUnit)
	return strings.TrimSpace(string(out))
}

// rig.UnitState is "ActiveState/SubState" of a unit in the host.
func (s *soak) unitState(unit string) string {
	out, err := s.r.H.Run(s.ctx, "systemctl", "show", "-p", "ActiveState", "-p", "SubState", "--value", unit)
	if err != nil {
		return "unknown: " + err.Error()
	}
	return strings.Join(strings.Fields(string(out)), "/")
}

// soakBusy: a unit state in which its process runs or is about to.
func soakBusy(st string) bool {
	return strings.HasPrefix(st, "active/running") || strings.HasPrefix(st, "activating") || strings.HasPrefix(st, "deactivating") ||
		strings.HasPrefix(st, "reloading")
}

// status reads status/<id>.json from the host (nil when absent or unreadable).
func (s *soak) status(id string) *requests.Status {
	data, err := s.r.H.ReadFile(soakBase + "/status/" + id + ".json")
	if err != nil {
		return nil
	}
	var st requests.Status
	if json.Unmarshal(data, &st) != nil {
		return nil
	}
	return &st
}

// waitHealthy polls the invariants until they hold (nil) or the bound passes (what was still wrong).
func (s *soak) waitHealthy(bound time.Duration) []string {
	deadline := time.Now().Add(bound)
	var bad []string
	for time.Now().Before(deadline) && s.ctx.Err() == nil {
		if bad = s.invariants(); len(bad) == 0 {
			return nil
		}
		sleepUntil(s.ctx, time.Now().Add(time.Second))
	}
	return bad
}

// invariants lists what is wrong with the host now (none: healthy and idle).
func (s *soak) invariants() []string {
	r, ctx := s.r, s.ctx
	var bad []string
	add := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }

	// The node runs on the slot applied/active names, and nowhere else.
	b, err := r.H.ReadFile(soakBase + "/applied/active")
	if err != nil {
		return []string{"applied/active: " + err.Error()}
	}
	slot := strings.TrimSpace(string(b))
	var applied state.Applied
	if data, err := r.H.ReadFile(soakBase + "/applied/" + slot + ".json"); err != nil {
		add("applied configuration of slot %q: %v", slot, err)
	} else if err := json.Unmarshal(data, &applied); err != nil {
		add("applied configuration of slot %q: %v", slot, err)
	}
	out, err := r.H.Run(ctx, "machinectl", "list", "--no-legend")
	var machines []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			machines = append(machines, f[0])
		}
	}
	if err != nil || len(machines) != 1 || machines[0] != slot {
		add("node machines running %v (err %v), want exactly [%s]", machines, err, slot)
	}
	for _, sl := range []string{"a", "b"} {
		st := s.unitState("systemd-nspawn@" + sl + ".service")
		if running := strings.HasPrefix(st, "active"); running != (sl == slot) {
			add("systemd-nspawn@%s is %s with active slot %s", sl, st, slot)
		}
	}
	node, err := r.Admin.CoreV1().Nodes().Get(ctx, r.Node, metav1.GetOptions{})
	if err != nil {
		add("Node: %v", err)
	} else {
		ready := "no Ready condition"
		for _, c := range node.Status.Conditions {
			if c.Type == "Ready" {
				ready = fmt.Sprintf("Ready=%s (%s)", c.Status, c.Reason)
				if c.Status == "True" {
					ready = ""
				}
			}
		}
		if ready != "" {
			add("Node %s", ready)
		}
		if s.label != "" && node.Labels[soakLabel] != s.label {
			add("Node label %s=%q, want %q", soakLabel, node.Labels[soakLabel], s.label)
		}
	}
	lease, err := r.Admin.CoordinationV1().Leases("kube-node-lease").Get(ctx, r.Node, metav1.GetOptions{})
	if err != nil {
		add("Node Lease: %v", err)
	} else if lease.Spec.RenewTime == nil || time.Since(lease.Spec.RenewTime.Time) > 45*time.Second {
		add("Node Lease not renewed in the last 45s (renewTime %v)", lease.Spec.RenewTime)
	}

	// The agent runs the version it should, and the Machine says what the host is.
	out, err = r.H.Run(ctx, soakBase+"/current/kubeslot-watcher", "--version")
	if got := strings.TrimSpace(string(out)); err != nil || got != "kubeslot-watcher "+s.version {
		add("current release: %q (err %v), want version %s", got, err, s.version)
	}
	if st := s.unitState(units.Watcher); st != "active/running" {
		add("%s is %s", units.Watcher, st)
	}
	m, err := r.MC.GetMachine(ctx, r.Node)
	if err != nil {
		add("Machine: %v", err)
	} else {
		st := m.Status
		fp := ""
		if st.Applied != nil {
			fp = string(st.Applied.Fingerprint)
		}
		if st.ActiveSlot != slot || st.Phase != v1alpha1.MachineReady || st.ObservedGeneration != m.Generation ||
			fp != applied.Fingerprint || st.AgentVersion != s.version {
			add("Machine status: slot %q phase %s generation %d/%d fingerprint %.12s agent %q; want slot %s, Ready, %d, %.12s, %s",
				st.ActiveSlot, st.Phase, st.ObservedGeneration, m.Generation, fp, st.AgentVersion, slot, m.Generation, applied.Fingerprint, s.version)
		}
	}

	// No request is stuck.
	out, err = r.H.Run(ctx, "sh", "-c", "ls -A "+soakBase+"/requests; cd "+soakBase+"/state && ls -d claimed-* repave.json 2>/dev/null; true")
	if left := strings.Fields(string(out)); err != nil || len(left) > 0 {
		add("requests not finished: %v (err %v)", left, err)
	}
	out, err = r.H.Run(ctx, "ls", soakBase+"/status")
	if err != nil {
		add("status/: %v", err)
	}
	for _, f := range strings.Fields(string(out)) {
		id, ok := strings.CutSuffix(f, ".json")
		if !ok {
			continue
		}
		if st := s.status(id); st == nil || !st.Phase.Finished() {
			add("status %s not finished: %+v", id, st)
		}
	}
	for _, u := range []string{"kubeslot-repave@next.service", "kubeslot-restart.service", "kubeslot-upgrade.service", "kubeslot-reset.service", units.Resetting} {
		// (A worker killed after its request finished stays "failed" with nothing left to do: not a stuck request.)
		if st := s.unitState(u); soakBusy(st) {
			add("%s is %s", u, st)
		}
	}
	return bad
}

// finalReset removes kubeslot through an AgentReset operation and checks the host holds nothing of it; TestMain's
// leak check follows.
func (s *soak) finalReset() {
	t, r := s.t, s.r
	t.Helper()
	name := r.Node + "-final-reset"
	t0 := time.Now()
	s.createOp(name, v1alpha1.OperationAgentReset, nil)
	var row soakRow
	done := s.opDone(name, t0, &row, nil)
	if fail := s.waitDone(func() (bool, string, string) {
		ok, detail, fail := done()
		if !ok || fail != "" {
			return ok, detail, fail
		}
		return s.resetDone()
	}, 5*time.Minute); fail != "" {
		t.Fatalf("final reset: %s\n%s", fail, s.journals())
	}
	var problems []string
	out, _ := r.H.Run(s.ctx, "sh", "-c", "find /etc/systemd/system -name 'kubeslot-*' -o -name 'systemd-nspawn@*' | grep -v -e '\\.d$' -e '\\.d/rig\\.conf$'; "+
		"ls -d /var/lib/machines/a /var/lib/machines/b 2>/dev/null; true")
	if left := strings.TrimSpace(string(out)); left != "" {
		problems = append(problems, "left after the reset:\n"+left)
	}
	if out, err := r.H.Run(s.ctx, "machinectl", "list", "--no-legend"); err != nil || strings.TrimSpace(string(out)) != "" {
		problems = append(problems, fmt.Sprintf("machines after the reset: %v %s", err, out))
	}
	out, _ = r.H.Run(s.ctx, "systemctl", "list-units", "--all", "--plain", "--no-legend", "kubeslot-*", "systemd-nspawn@*")
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[2] != "inactive" {
			problems = append(problems, "unit still "+f[2]+": "+l)
		}
	}
	if len(problems) > 0 {
		t.Errorf("final reset (%s): the host is not clean:\n%s", row.opResult, strings.Join(problems, "\n"))
		return
	}
	fmt.Printf("soak: final reset: %s, host clean (the leak check follows at the end of the run)\n", row.opResult)
}

// journals is the kubeslot units' and the nodes' journals, for a failed round.
func (s *soak) journals() string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var b strings.Builder
	for _, u := range []string{units.Watcher, "kubeslot-repave@next.service", "kubeslot-restart.service", "kubeslot-upgrade.service",
		"kubeslot-reset.service", units.Resetting, units.Recovery, units.Bootstrap} {
		if j, err := s.r.H.Journal(ctx, u); err == nil && strings.TrimSpace(j) != "" {
			fmt.Fprintf(&b, "--- %s:\n%s", u, rig.TailLines(j, 50))
		}
	}
	out, _ := s.r.H.Run(ctx, "sh", "-c", "ls -la "+soakBase+"/requests "+soakBase+"/state "+soakBase+"/status 2>&1; cat "+soakBase+"/applied/active 2>&1; machinectl list 2>&1")
	fmt.Fprintf(&b, "--- host root:\n%s\n", out)
	return b.String() + rig.HostDiag(s.r.H)
}

// table prints the rounds.
func (s *soak) table(seed uint64) {
	var b strings.Builder
	fmt.Fprintf(&b, "soak: %d rounds, seed %d (%s=%d replays the plan)\n", len(s.rows), seed, envSoakSeed, seed)
	fmt.Fprintf(&b, "%-5s %-15s %-58s %-34s %-48s %9s  %s\n", "round", "operation", "kill -9 (process (unit), moment)", "power cut", "operation result", "recovery", "result")
	for _, r := range s.rows {
		fmt.Fprintf(&b, "%-5d %-15s %-58s %-34s %-48s %9s  %s\n", r.n, r.op, r.kill, r.cut, r.opResult, secs(r.recovery), r.result)
	}
	fmt.Print(b.String())
	s.t.Log("\n" + b.String())
}

func sleepUntil(ctx context.Context, when time.Time) {
	select {
	case <-ctx.Done():
	case <-time.After(time.Until(when)):
	}
}

func secs(d time.Duration) string { return fmt.Sprintf("%.1fs", d.Seconds()) }

func firstLineOf(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 60 {
		s = s[:57] + "..."
	}
	return s
}

// TestSoakPlans: the plan is the seed's (a replay draws the same rounds), every block of four rounds has each
// operation once and one power cut, and every moment lies within its window.
func TestSoakPlans(t *testing.T) {
	a, b := soakPlans(42, 30), soakPlans(42, 30)
	if !slices.Equal(a, b) {
		t.Fatal("the same seed drew two plans")
	}
	if slices.Equal(a, soakPlans(43, 30)) {
		t.Error("seeds 42 and 43 drew the same plan")
	}
	for i := 0; i < len(a); i += 4 {
		block := a[i:min(i+4, len(a))]
		ops, cuts := map[soakOp]bool{}, 0
		for _, p := range block {
			ops[p.op] = true
			if p.cut {
				cuts++
			}
			w := soakWindow[p.op]
			if p.killWorker {
				w = soakWorkerWindow[p.op]
			}
			if p.killAt < 0 || p.killAt > w {
				t.Errorf("round %d: kill at %s, outside %s", i+1, p.killAt, w)
			}
			w = soakWindow[p.op]
			if p.op == soakReset {
				w += soakBootstrapWindow
			}
			if p.cutAt < 0 || p.cutAt > w {
				t.Errorf("round %d: power cut at %s, outside %s", i+1, p.cutAt, w)
			}
		}
		if len(block) == 4 && (len(ops) != 4 || cuts != 1) {
			t.Errorf("rounds %d-%d: operations %v, %d power cuts; want all four, one cut", i+1, i+4, ops, cuts)
		}
	}
	if got := soakPlans(7, 5); len(got) != 5 {
		t.Errorf("5 rounds drew %d", len(got))
	}
}
