package watcher

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
)

const node = "node-1"

func applied(t *testing.T) *state.Applied {
	t.Helper()
	cfg := testhost.Example(t)
	return &state.Applied{Slot: "a", Config: cfg, Fingerprint: cfg.Fingerprint()}
}

// base is a host whose Machine matches what it runs.
func base(t *testing.T) Inputs {
	a := applied(t)
	m := NewMachine("m1", node, a)
	m.Generation = 4
	return Inputs{NodeName: node, MachineName: "m1", Machine: m, NodeSynced: true, NodeExists: true, Applied: a,
		Pending: map[requests.Kind]*requests.Request{}, Claimed: map[requests.Kind]*requests.Request{}, Published: requests.Published{}}
}

func op(name string, typ v1alpha1.OperationType, target string) v1alpha1.MachineOperation {
	o := v1alpha1.MachineOperation{Spec: v1alpha1.MachineOperationSpec{Type: typ, MachineRef: &v1alpha1.MachineReference{Name: target}}}
	o.Name = name
	if typ == v1alpha1.OperationAgentUpgrade {
		o.Spec.Parameters = &v1alpha1.OperationParameters{BundleURL: "https://x/b.tgz", BundleSHA256: v1alpha1.SHA256(strings.Repeat("a", 64))}
	}
	return o
}

func newVersion(in *Inputs) {
	in.Machine.Spec.Node.KubernetesVersion = "1.99.0"
	in.Machine.Generation++
}

// newPatch asks for the next patch release of the running version, with
// the update policy Immediate.
func newPatch(in *Inputs) {
	var major, minor, patch int
	if _, err := fmt.Sscanf(in.Applied.Config.Kubernetes.Version, "%d.%d.%d", &major, &minor, &patch); err != nil {
		panic(err)
	}
	in.Machine.Spec.Node.KubernetesVersion = fmt.Sprintf("%d.%d.%d", major, minor, patch+1)
	in.Machine.Spec.UpdatePolicy = v1alpha1.UpdateImmediate
	in.Machine.Generation++
}

// summary renders actions as short strings for comparison.
func summary(as []Action) []string {
	var out []string
	for _, a := range as {
		switch a.Type {
		case WriteRequest:
			out = append(out, "write "+a.Request.ID)
		case PublishStatus:
			out = append(out, "publish "+a.Status.RequestID+" "+string(a.Status.Phase))
		case RegisterMachine:
			out = append(out, "register "+a.Machine.Name)
		case FinishUpgrade:
			if a.Status == nil {
				out = append(out, "finish (signal only)")
			} else {
				out = append(out, "finish "+a.Status.RequestID+" "+string(a.Status.Phase))
			}
		case EndProbation:
			out = append(out, fmt.Sprintf("end probation %s advance=%v", a.Probation.ToRelease, a.Advance))
		case ReportRollback:
			out = append(out, "report rollback "+a.Probation.RequestID)
		case ReportMachine:
			s := "report " + string(a.Phase)
			for _, c := range a.Conditions {
				if c.Status == "True" {
					s += " " + c.Type + "/" + c.Reason
				}
			}
			out = append(out, s)
		}
	}
	return out
}

func TestDecide(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*Inputs)
		want   []string
	}{
		{"up to date", func(*Inputs) {}, []string{"report Ready"}},
		{"immediate: spec change repaves", func(in *Inputs) {
			newVersion(in)
			in.Machine.Spec.UpdatePolicy = v1alpha1.UpdateImmediate
		}, []string{"write repave-5-spec", "report Repaving RepavePending/Dispatched"}},
		{"immediate: already dispatched (pending file)", func(in *Inputs) {
			newVersion(in)
			in.Machine.Spec.UpdatePolicy = v1alpha1.UpdateImmediate
			in.Pending[requests.Repave] = &requests.Request{Kind: requests.Repave, ID: "repave-5-spec"}
		}, []string{"report Repaving RepavePending/Dispatched"}},
		{"immediate: already ran (status file, kill -9 after the worker)", func(in *Inputs) {
			newVersion(in)
			in.Machine.Spec.UpdatePolicy = v1alpha1.UpdateImmediate
			in.Statuses = []*requests.Status{{RequestID: "repave-5-spec", Kind: requests.Repave, Phase: requests.Failed}}
			in.Published["repave-5-spec"] = requests.Failed
		}, []string{"report Ready RepavePending/Dispatched"}},
		{"a patch release goes in place", newPatch, []string{"write restart-5-spec", "report Ready RepavePending/DispatchedInPlace"}},
		{"a patch release repaves when the method says Repave", func(in *Inputs) {
			newPatch(in)
			in.Machine.Spec.UpdateMethod = v1alpha1.UpdateRepave
		}, []string{"write repave-5-spec", "report Repaving RepavePending/Dispatched"}},
		{"InPlace: a minor release applies nothing", func(in *Inputs) {
			newVersion(in)
			in.Machine.Spec.UpdatePolicy = v1alpha1.UpdateImmediate
			in.Machine.Spec.UpdateMethod = v1alpha1.UpdateInPlace
		}, []string{"report Ready RepavePending/InPlaceNotPossible"}},
		{"a patch waits while the spec's repave is claimed", func(in *Inputs) {
			newPatch(in)
			in.Claimed[requests.Repave] = &requests.Request{Kind: requests.Repave, ID: "repave-4-spec"}
		}, []string{"report Repaving RepavePending/DispatchedInPlace"}},
		{"a repave waits while the spec's patch is pending", func(in *Inputs) {
			newVersion(in)
			in.Machine.Spec.UpdatePolicy = v1alpha1.UpdateImmediate
			in.Pending[requests.Restart] = &requests.Request{Kind: requests.Restart, ID: "restart-4-spec"}
		}, []string{"report Ready RepavePending/Dispatched"}},
		{"a newer patch replaces a pending one", func(in *Inputs) {
			newPatch(in)
			in.Pending[requests.Restart] = &requests.Request{Kind: requests.Restart, ID: "restart-4-spec"}
		}, []string{"write restart-5-spec", "report Ready RepavePending/DispatchedInPlace"}},
		{"a patch waits for an operation's restart", func(in *Inputs) {
			newPatch(in)
			in.Pending[requests.Restart] = &requests.Request{Kind: requests.Restart, ID: "restart-4-op1"}
		}, []string{"report Ready RepavePending/DispatchedInPlace"}},
		{"a newer spec replaces a pending spec repave", func(in *Inputs) {
			newVersion(in)
			in.Machine.Spec.UpdatePolicy = v1alpha1.UpdateImmediate
			in.Pending[requests.Repave] = &requests.Request{Kind: requests.Repave, ID: "repave-4-spec"}
		}, []string{"write repave-5-spec", "report Repaving RepavePending/Dispatched"}},
		{"a pending operation repave is not replaced by a spec repave", func(in *Inputs) {
			newVersion(in)
			in.Machine.Spec.UpdatePolicy = v1alpha1.UpdateImmediate
			in.Pending[requests.Repave] = &requests.Request{Kind: requests.Repave, ID: "repave-4-op1"}
		}, []string{"report Repaving RepavePending/Dispatched"}},
		{"a claimed spec repave is not replaced", func(in *Inputs) {
			newVersion(in)
			in.Machine.Spec.UpdatePolicy = v1alpha1.UpdateImmediate
			in.Claimed[requests.Repave] = &requests.Request{Kind: requests.Repave, ID: "repave-4-spec"}
		}, []string{"report Repaving RepavePending/Dispatched"}},
		{"on node delete: waits while the Node exists", func(in *Inputs) { newVersion(in) },
			[]string{"report Ready RepavePending/WaitingForNodeDeletion"}},
		{"on node delete: waits while the Node watch has not listed", func(in *Inputs) {
			newVersion(in)
			in.NodeSynced, in.NodeExists = false, false
		}, []string{"report Ready RepavePending/WaitingForNodeDeletion"}},
		{"on node delete: repaves once the Node is gone", func(in *Inputs) { newVersion(in); in.NodeExists = false },
			[]string{"write repave-5-spec", "report Repaving RepavePending/Dispatched"}},
		{"paused holds a spec change", func(in *Inputs) {
			newVersion(in)
			in.Machine.Spec.UpdatePolicy = v1alpha1.UpdateImmediate
			in.Machine.Spec.Paused = true
		}, []string{"report Ready RepavePending/Paused"}},
		{"paused holds operations but reset", func(in *Inputs) {
			in.Machine.Spec.Paused = true
			in.Operations = []v1alpha1.MachineOperation{op("r1", v1alpha1.OperationNodeRestart, "m1"), op("x1", v1alpha1.OperationAgentReset, "m1")}
		}, []string{"write reset-4-x1", "report Resetting"}},
		{"restart operation", func(in *Inputs) {
			in.Operations = []v1alpha1.MachineOperation{op("r1", v1alpha1.OperationNodeRestart, "m1")}
		}, []string{"write restart-4-r1", "report Ready"}},
		{"update operation: a patch release held by OnNodeDelete goes in place", func(in *Inputs) {
			newPatch(in)
			in.Machine.Spec.UpdatePolicy = v1alpha1.UpdateOnNodeDelete
			in.Operations = []v1alpha1.MachineOperation{op("up", v1alpha1.OperationUpdate, "m1")}
		}, []string{"write restart-5-up", "report Ready RepavePending/WaitingForNodeDeletion"}},
		{"update operation: a minor release repaves", func(in *Inputs) {
			newVersion(in)
			in.Operations = []v1alpha1.MachineOperation{op("up", v1alpha1.OperationUpdate, "m1")}
		}, []string{"write repave-5-up", "report Repaving RepavePending/WaitingForNodeDeletion"}},
		{"update operation: updateMethod Repave repaves a patch", func(in *Inputs) {
			newPatch(in)
			in.Machine.Spec.UpdatePolicy = v1alpha1.UpdateOnNodeDelete
			in.Machine.Spec.UpdateMethod = v1alpha1.UpdateRepave
			in.Operations = []v1alpha1.MachineOperation{op("up", v1alpha1.OperationUpdate, "m1")}
		}, []string{"write repave-5-up", "report Repaving RepavePending/WaitingForNodeDeletion"}},
		{"update operation: nothing to change only waits for the node", func(in *Inputs) {
			in.Operations = []v1alpha1.MachineOperation{op("up", v1alpha1.OperationUpdate, "m1")}
		}, []string{"write restart-4-up", "report Ready"}},
		{"upgrade operation", func(in *Inputs) {
			in.Operations = []v1alpha1.MachineOperation{op("u1", v1alpha1.OperationAgentUpgrade, "m1")}
		}, []string{"write upgrade-4-u1", "report Upgrading"}},
		{"operation for another machine is ignored", func(in *Inputs) {
			in.Operations = []v1alpha1.MachineOperation{op("r1", v1alpha1.OperationNodeRestart, "m2")}
		}, []string{"report Ready"}},
		{"selector operation matching the labels", func(in *Inputs) {
			in.Machine.Labels = map[string]string{"pool": "x", v1alpha1.LabelEnrolled: "true"}
			o := op("r1", v1alpha1.OperationNodeRestart, "")
			o.Spec.MachineRef = nil
			o.Spec.MachineSelector = &v1alpha1.MachineSelector{MatchLabels: map[string]string{"pool": "x"}}
			in.Operations = []v1alpha1.MachineOperation{o}
		}, []string{"write restart-4-r1", "report Ready"}},
		{"selector operation matching the labels of a Machine no administrator enrolled", func(in *Inputs) {
			in.Machine.Labels = map[string]string{"pool": "x"}
			o := op("r1", v1alpha1.OperationNodeRestart, "")
			o.Spec.MachineRef = nil
			o.Spec.MachineSelector = &v1alpha1.MachineSelector{MatchLabels: map[string]string{"pool": "x"}}
			in.Operations = []v1alpha1.MachineOperation{o}
		}, []string{"report Ready"}},
		{"operation already dispatched under an older generation", func(in *Inputs) {
			in.Operations = []v1alpha1.MachineOperation{op("r1", v1alpha1.OperationNodeRestart, "m1")}
			in.Statuses = []*requests.Status{{RequestID: "restart-3-r1", Kind: requests.Restart, Operation: "r1", Phase: requests.InProgress}}
		}, []string{"publish restart-3-r1 InProgress", "report Ready"}},
		{"finished entry is not redispatched", func(in *Inputs) {
			o := op("r1", v1alpha1.OperationNodeRestart, "m1")
			o.Status.Machines = []v1alpha1.MachineOperationTarget{{Name: "m1", NodeName: node, Phase: v1alpha1.OperationSucceeded}}
			in.Operations = []v1alpha1.MachineOperation{o}
		}, []string{"report Ready"}},
		{"a claimed request of the kind blocks a second", func(in *Inputs) {
			in.Operations = []v1alpha1.MachineOperation{op("r2", v1alpha1.OperationNodeRestart, "m1")}
			in.Claimed[requests.Restart] = &requests.Request{Kind: requests.Restart, ID: "restart-4-r1"}
		}, []string{"report Ready"}},
		{"requests are written before results are published", func(in *Inputs) {
			in.Operations = []v1alpha1.MachineOperation{op("r2", v1alpha1.OperationNodeRestart, "m1")}
			in.Statuses = []*requests.Status{{RequestID: "reset-1-x", Phase: requests.Failed}}
		}, []string{"write restart-4-r2", "publish reset-1-x Failed", "report Ready"}},
		{"published statuses are not published again", func(in *Inputs) {
			in.Statuses = []*requests.Status{{RequestID: "restart-4-r1", Phase: requests.Succeeded}, {RequestID: "restart-2-r0", Phase: requests.Failed}}
			in.Published["restart-4-r1"] = requests.InProgress
			in.Published["restart-2-r0"] = requests.Failed
		}, []string{"publish restart-4-r1 Succeeded", "report Ready"}},
		{"invalid spec: Degraded, nothing dispatched", func(in *Inputs) {
			in.Machine.Spec.Node.RootFS.SHA256 = "nothex"
			in.Machine.Spec.UpdatePolicy = v1alpha1.UpdateImmediate
			in.NodeExists = false
			in.Operations = []v1alpha1.MachineOperation{op("r1", v1alpha1.OperationNodeRestart, "m1"), op("p1", v1alpha1.OperationRepave, "m1")}
		}, []string{"report Degraded Degraded/InvalidSpec"}},
		{"corrupt applied config: nothing dispatched", func(in *Inputs) {
			newVersion(in)
			in.Machine.Spec.UpdatePolicy = v1alpha1.UpdateImmediate
			in.Applied, in.AppliedErr = nil, &hostroot.CorruptError{Path: "/opt/kubeslot/applied/a.json", Reason: "checksum mismatch"}
			in.Operations = []v1alpha1.MachineOperation{op("r1", v1alpha1.OperationNodeRestart, "m1")}
		}, []string{"report Degraded Degraded/AppliedConfigCorrupt"}},
		{"machine missing: register", func(in *Inputs) { in.Machine = nil }, []string{"register m1"}},
		{"machine of another node", func(in *Inputs) { in.Machine.Spec.NodeName = "node-2" },
			[]string{"report Degraded Degraded/WrongNode"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := base(t)
			c.mutate(&in)
			got := summary(Decide(in))
			if strings.Join(got, "; ") != strings.Join(c.want, "; ") {
				t.Errorf("got  %q\nwant %q", got, c.want)
			}
		})
	}
}

func TestDecideInvalidSpecNamesFieldAndValue(t *testing.T) {
	in := base(t)
	in.Machine.Spec.Node.RootFS.SHA256 = "nothex"
	as := Decide(in)
	msg := as[len(as)-1].Conditions[0].Message
	if !strings.Contains(msg, "spec.node.rootfs.sha256") || !strings.Contains(msg, "nothex") {
		t.Errorf("Degraded message %q does not name the field and value", msg)
	}
}

func TestDecideRepaveCarriesDesired(t *testing.T) {
	in := base(t)
	newVersion(&in)
	in.NodeExists = false
	as := Decide(in)
	r := as[0].Request
	if r == nil || r.Desired == nil || r.Desired.Kubernetes.Version != "1.99.0" || r.MachineGeneration != 5 {
		t.Fatalf("request %+v", r)
	}
	if in.Applied.Config.Kubernetes.Version == "1.99.0" {
		t.Fatal("Desired changed the applied configuration")
	}
	if r.Desired.Cluster != in.Applied.Config.Cluster {
		t.Error("desired lost the cluster settings")
	}
}

func TestDesiredOfRegisteredMachineIsApplied(t *testing.T) {
	a := applied(t)
	m := NewMachine("m1", node, a)
	d, err := Desired(a.Config, &m.Spec.Node, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d.Fingerprint() != a.Config.Fingerprint() {
		t.Error("a Machine registered from the applied config asks for a different one")
	}
	if _, err := Desired(nil, &m.Spec.Node, nil); !errors.Is(err, err) || err == nil {
		t.Error("nil applied accepted")
	}
}

// signal is a pending upgrade from v1 to v2 of operation u1.
func signal() *requests.UpgradeSignal {
	return &requests.UpgradeSignal{RequestID: "upgrade-4-u1", Operation: "u1", MachineGeneration: 4,
		FromRelease: "blue", FromVersion: "v1", ToRelease: "green", ToVersion: "v2",
		Phases: []requests.PhaseTiming{{Name: "download"}, {Name: "switch"}}}
}

func TestDecideUpgradeSignal(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*Inputs)
		want   []string
	}{
		{"no signal", func(*Inputs) {}, []string{"report Ready"}},
		{"old release, switch not verified yet: wait", func(in *Inputs) {
			in.AgentVersion = "v1"
		}, []string{"report Ready"}},
		{"old release, verified (the old watcher before its restart): wait", func(in *Inputs) {
			in.AgentVersion = "v1"
			in.Upgrade.Verified = true
		}, []string{"report Ready"}},
		{"new release, not verified yet: wait", func(in *Inputs) {
			in.AgentVersion = "v2"
		}, []string{"report Ready"}},
		{"new release, verified: Succeeded at once (the probation follows)", func(in *Inputs) {
			in.AgentVersion = "v2"
			in.Upgrade.Verified = true
		}, []string{"finish upgrade-4-u1 Succeeded", "report Ready"}},
		{"failure recorded: Failed at once", func(in *Inputs) {
			in.AgentVersion = "v1"
			in.Upgrade.Failure = "the new watcher exited 1"
		}, []string{"finish upgrade-4-u1 Failed", "report Ready"}},
		{"failure recorded, even though verified", func(in *Inputs) {
			in.AgentVersion = "v2"
			in.Upgrade.Verified, in.Upgrade.Failure = true, "crashed after the upgrader exited"
		}, []string{"finish upgrade-4-u1 Failed", "report Ready"}},
		{"final status already written (killed before the signal went): signal only, then publish", func(in *Inputs) {
			in.AgentVersion = "v2"
			in.Upgrade.Verified = true
			in.Statuses = []*requests.Status{{RequestID: "upgrade-4-u1", Kind: requests.Upgrade, Operation: "u1", Phase: requests.Succeeded}}
		}, []string{"finish (signal only)", "publish upgrade-4-u1 Succeeded", "report Ready"}},
		{"an InProgress status of the upgrader does not count as final", func(in *Inputs) {
			in.Upgrade.Failure = "rolled back"
			in.Statuses = []*requests.Status{{RequestID: "upgrade-4-u1", Kind: requests.Upgrade, Operation: "u1", Phase: requests.InProgress}}
			in.Published["upgrade-4-u1"] = requests.InProgress
		}, []string{"finish upgrade-4-u1 Failed", "report Ready"}},
		{"recorded even when the applied configuration is corrupt", func(in *Inputs) {
			in.Upgrade.Failure = "rolled back"
			in.Applied, in.AppliedErr = nil, &hostroot.CorruptError{Path: "/opt/kubeslot/applied/a.json", Reason: "checksum mismatch"}
		}, []string{"finish upgrade-4-u1 Failed", "report Degraded Degraded/AppliedConfigCorrupt"}},
		{"recorded even when the Machine is missing", func(in *Inputs) {
			in.Upgrade.Failure = "rolled back"
			in.Machine = nil
		}, []string{"finish upgrade-4-u1 Failed", "register m1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := base(t)
			in.Upgrade = signal()
			if c.name == "no signal" {
				in.Upgrade = nil
			}
			c.mutate(&in)
			got := summary(Decide(in))
			if strings.Join(got, "; ") != strings.Join(c.want, "; ") {
				t.Errorf("got  %q\nwant %q", got, c.want)
			}
		})
	}
}

func TestDecideUpgradeStatusCarriesTheSignal(t *testing.T) {
	in := base(t)
	in.Upgrade = signal()
	in.Upgrade.Verified = true
	in.AgentVersion = "v2"
	s := Decide(in)[0].Status
	if s == nil || s.Kind != requests.Upgrade || s.Operation != "u1" || s.MachineGeneration != 4 || len(s.Phases) != 2 ||
		s.Message != "agent upgraded from v1 to v2" {
		t.Fatalf("status %+v", s)
	}
	in.Upgrade.Failure = "health gate: MainPID 42 exited"
	s = Decide(in)[0].Status
	if s == nil || s.Phase != requests.Failed || s.Message != in.Upgrade.Failure || s.Operation != "u1" || len(s.Phases) != 2 {
		t.Fatalf("status %+v", s)
	}
}

// A Succeeded verdict puts the release on probation: the action carries it.
func TestDecideSucceededStartsProbation(t *testing.T) {
	in := base(t)
	in.Upgrade = signal()
	in.Upgrade.Verified = true
	in.AgentVersion = "v2"
	a := Decide(in)[0]
	p := a.Probation
	if a.Type != FinishUpgrade || p == nil || p.RequestID != "upgrade-4-u1" || p.Operation != "u1" || p.MachineGeneration != 4 ||
		p.FromRelease != "blue" || p.FromVersion != "v1" || p.ToRelease != "green" || p.ToVersion != "v2" {
		t.Fatalf("action %+v, probation %+v", a, p)
	}
	in.Upgrade.Failure = "rolled back"
	if a := Decide(in)[0]; a.Probation != nil {
		t.Errorf("a Failed verdict starts a probation: %+v", a.Probation)
	}
}

// probationOf is release green (v2, from blue v1) on probation after upgrade-4-u1.
func probationOf() *requests.Probation {
	return &requests.Probation{RequestID: "upgrade-4-u1", Operation: "u1", MachineGeneration: 4, FromRelease: "blue",
		FromVersion: "v1", ToRelease: "green", ToVersion: "v2", SucceededAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func TestDecideProbation(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*Inputs)
		want   string
		waits  bool
	}{
		{"on probation, window not over: wait", func(*Inputs) {}, "report Ready", true},
		{"window over: last-good advances", func(in *Inputs) { in.ProbationOver = true },
			"end probation green advance=true; report Ready", false},
		{"last-good already advanced (killed before the file went): the file goes", func(in *Inputs) { in.LastGood = "green" },
			"end probation green advance=false; report Ready", false},
		{"a watcher of another version (before its re-exec): wait, no timer", func(in *Inputs) {
			in.AgentVersion, in.ProbationOver = "v1", true
		}, "report Ready", false},
		{"rolled back by the recovery unit: reported", func(in *Inputs) {
			in.Probation.Reason, in.Current, in.AgentVersion = "kept failing", "blue", "v1"
		}, "report rollback upgrade-4-u1; report Ready", false},
		{"current moved away without a recorded reason (recovery killed before it wrote one): reported", func(in *Inputs) {
			in.Current, in.AgentVersion, in.ProbationOver = "blue", "v1", true
		}, "report rollback upgrade-4-u1; report Ready", false},
		{"a rollback waits for the Machine", func(in *Inputs) {
			in.Probation.Reason, in.Machine = "kept failing", nil
		}, "register m1", false},
		{"killed between the probation file and the status, then rolled back: Failed, the file goes", func(in *Inputs) {
			in.Probation.Reason, in.Current, in.AgentVersion = "kept failing", "blue", "v1"
			in.Upgrade = signal()
			in.Upgrade.Failure = "kept failing"
		}, "finish upgrade-4-u1 Failed; end probation green advance=false; report Ready", false},
		{"killed between the status and the signal's removal, then rolled back: the rollback is reported", func(in *Inputs) {
			in.Probation.Reason, in.Current, in.AgentVersion = "kept failing", "blue", "v1"
			in.Upgrade = signal()
			in.Upgrade.Failure = "kept failing"
			in.Statuses = []*requests.Status{{RequestID: "upgrade-4-u1", Kind: requests.Upgrade, Operation: "u1", Phase: requests.Succeeded}}
			in.Published["upgrade-4-u1"] = requests.Succeeded
		}, "finish (signal only); report rollback upgrade-4-u1; report Ready", false},
		{"a rollback waits until the Succeeded it undoes is published (killed in between)", func(in *Inputs) {
			in.Probation.Reason, in.Current, in.AgentVersion = "kept failing", "blue", "v1"
			in.Statuses = []*requests.Status{{RequestID: "upgrade-4-u1", Kind: requests.Upgrade, Operation: "u1", Phase: requests.Succeeded}}
		}, "publish upgrade-4-u1 Succeeded; report Ready", false},
		{"links unknown: never read as a rollback", func(in *Inputs) { in.Current, in.LastGood = "", "" },
			"report Ready", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := base(t)
			in.Probation, in.AgentVersion, in.Current, in.LastGood = probationOf(), "v2", "green", "blue"
			c.mutate(&in)
			if got := strings.Join(summary(Decide(in)), "; "); got != c.want {
				t.Errorf("got  %q\nwant %q", got, c.want)
			}
			if got := probationWaits(in); got != c.waits {
				t.Errorf("probationWaits %v, want %v", got, c.waits)
			}
		})
	}
}

func TestRollbackMessage(t *testing.T) {
	p := probationOf()
	p.Reason = "the new watcher v2 kept failing after the upgrade; recovered to v1"
	want := "agent upgrade v1 -> v2 was reported Succeeded at 2026-01-02T03:04:05Z, then rolled back to v1 while on probation: " + p.Reason
	if got := rollbackMessage(p, "blue"); got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	p.Reason = ""
	if got := rollbackMessage(p, "blue"); !strings.HasSuffix(got, "release green is no longer current (blue is)") {
		t.Errorf("without a reason: %q", got)
	}
}

func TestDecideHooksFailureReported(t *testing.T) {
	in := base(t)
	in.HooksErr = "reload systemd: connection refused"
	got := summary(Decide(in))
	if strings.Join(got, "; ") != "report Degraded Degraded/LifecycleHooksFailed" {
		t.Errorf("got %q", got)
	}
	as := Decide(in)
	if msg := as[len(as)-1].Conditions[len(as[len(as)-1].Conditions)-1].Message; !strings.Contains(msg, "connection refused") || !strings.Contains(msg, "slot a") {
		t.Errorf("Degraded message %q does not say which slot and why", msg)
	}
	// A spec error wins: it is what an admin must fix first.
	in.Machine.Spec.Node.RootFS.SHA256 = "nothex"
	if got := summary(Decide(in)); strings.Join(got, "; ") != "report Degraded Degraded/InvalidSpec" {
		t.Errorf("with an invalid spec too: got %q", got)
	}
}

// TestDesiredSandboxImage: the Machine's sandbox image replaces the host's,
// empty keeps it, and a bad one is refused naming the spec field.
func TestDesiredSandboxImage(t *testing.T) {
	a := applied(t)
	m := NewMachine("m1", node, a)
	m.Spec.Node.SandboxImage = "mirror.example:5000/pause:3.10.1"
	d, err := Desired(a.Config, &m.Spec.Node, nil)
	if err != nil || d.Node.Sandbox() != "mirror.example:5000/pause:3.10.1" {
		t.Fatalf("desired sandbox image %q, %v", d.Node.Sandbox(), err)
	}
	if a.Config.Node.SandboxImage != "" {
		t.Error("Desired changed the applied configuration")
	}
	m.Spec.Node.SandboxImage = "pause"
	if _, err := Desired(a.Config, &m.Spec.Node, nil); err == nil || !strings.Contains(err.Error(), "spec.node.sandboxImage") {
		t.Errorf("bad sandbox image: %v", err)
	}
}

// TestRetryDelay: failed passes back off from 2 s to a 5 minute cap, each
// jittered within ±20 %.
func TestRetryDelay(t *testing.T) {
	for n, want := range map[int]time.Duration{1: 2 * time.Second, 2: 4 * time.Second, 5: 32 * time.Second, 9: 5 * time.Minute, 100: 5 * time.Minute} {
		lo, hi := retryDelay(n, 0), retryDelay(n, 0.999)
		if lo != time.Duration(float64(want)*0.8) || hi > time.Duration(float64(want)*1.2) || hi <= lo {
			t.Errorf("failure %d: delays %v..%v, want %v ±20%%", n, lo, hi, want)
		}
	}
}

// The Kubernetes version picks the kubelet from the release mirror: a
// spec that names a mirror drops the host's kubelet file, a pin never
// travels from the applied configuration into a request, and a Machine
// registered from a mirror configuration names no kubelet file.
func TestDesiredKubernetesRelease(t *testing.T) {
	a := applied(t)
	a.Config.Artifacts.KubeletPinned = &config.Artifact{URL: "https://m.example/v1.37.2/bin/linux/amd64/kubelet", SHA256: strings.Repeat("cd", 32)}
	m := NewMachine("m1", node, a)
	m.Spec.Node.KubernetesVersion = "1.37.1"
	d, err := Desired(a.Config, &m.Spec.Node, nil)
	if err != nil || d.Artifacts.KubeletPinned != nil {
		t.Fatalf("desired pin %+v, %v: the pin of the applied version must not travel", d.Artifacts.KubeletPinned, err)
	}
	if d.Artifacts.Kubelet.URL == "" {
		t.Error("without a spec mirror the host's kubelet file stays")
	}
	m.Spec.Node.Artifacts.Kubelet = nil
	m.Spec.Node.KubernetesRelease = &v1alpha1.KubernetesRelease{Mirror: "https://mirror.example/release"}
	d, err = Desired(a.Config, &m.Spec.Node, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d.Artifacts.Kubelet.URL != "" || d.Kubernetes.Release.Mirror != "https://mirror.example/release" {
		t.Errorf("desired kubelet %+v, release %+v: the spec's mirror must pick the kubelet", d.Artifacts.Kubelet, d.Kubernetes.Release)
	}
	m.Spec.Node.KubernetesRelease.Mirror = "https://mirror.example/release?x=1"
	if _, err := Desired(a.Config, &m.Spec.Node, nil); err == nil || !strings.Contains(err.Error(), "spec.node.kubernetesRelease.mirror") {
		t.Errorf("bad mirror: %v, want an error naming the spec field", err)
	}
	// Plain http is refused by the Go-side check too (the CRD refuses it
	// first), naming the spec field and its value.
	m.Spec.Node.KubernetesRelease.Mirror = "http://mirror.example/release"
	if _, err := Desired(a.Config, &m.Spec.Node, nil); err == nil || !strings.Contains(err.Error(), "spec.node.kubernetesRelease.mirror") ||
		!strings.Contains(err.Error(), "http://mirror.example/release") || !strings.Contains(err.Error(), "https") {
		t.Errorf("http mirror: %v, want an error naming the spec field, the value and https", err)
	}
	// Registered from a configuration whose kubelet comes from its mirror.
	a2 := applied(t)
	a2.Config.Kubernetes.Release.Mirror = "https://mirror.example/release"
	a2.Config.Artifacts.Kubelet = config.Artifact{}
	m2 := NewMachine("m1", node, a2)
	if m2.Spec.Node.Artifacts.Kubelet != nil {
		t.Errorf("registered Machine names kubelet %+v", m2.Spec.Node.Artifacts.Kubelet)
	}
	if d, err := Desired(a2.Config, &m2.Spec.Node, nil); err != nil || d.Fingerprint() != a2.Config.Fingerprint() {
		t.Errorf("registered from a mirror configuration, it asks for another: %v", err)
	}
}

// A spec's kubelet digest pins its version's kubelet on top of the host's
// pins; it may not contradict a host pin for the same version.
func TestDesiredKubeletPin(t *testing.T) {
	hostSum, specSum := strings.Repeat("ab", 32), strings.Repeat("cd", 32)
	a := applied(t)
	a.Config.Kubernetes.Release = config.Release{Mirror: "https://host.example/release", KubeletSHA256: map[string]string{"1.36.0": hostSum}}
	a.Config.Artifacts.Kubelet = config.Artifact{}
	m := NewMachine("m1", node, a)
	m.Spec.Node.KubernetesVersion = "1.37.1"
	m.Spec.Node.KubernetesRelease = &v1alpha1.KubernetesRelease{Mirror: "https://mirror.example/release", KubeletSHA256: v1alpha1.SHA256(specSum)}
	d, err := Desired(a.Config, &m.Spec.Node, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Kubernetes.Release.KubeletSHA256; len(got) != 2 || got["1.37.1"] != specSum || got["1.36.0"] != hostSum {
		t.Errorf("desired pins %v, want the host's and the spec's", got)
	}
	if len(a.Config.Kubernetes.Release.KubeletSHA256) != 1 {
		t.Errorf("Desired changed the applied pins: %v", a.Config.Kubernetes.Release.KubeletSHA256)
	}
	// No spec mirror: the host's pins alone.
	m.Spec.Node.KubernetesRelease = nil
	if d, err := Desired(a.Config, &m.Spec.Node, nil); err != nil || d.Kubernetes.Release.KubeletSHA256["1.36.0"] != hostSum {
		t.Errorf("host pins without a spec mirror: %v, %v", d, err)
	}
	// The spec contradicts the host's pin for the version.
	m.Spec.Node.KubernetesVersion = "1.36.0"
	m.Spec.Node.KubernetesRelease = &v1alpha1.KubernetesRelease{Mirror: "https://mirror.example/release", KubeletSHA256: v1alpha1.SHA256(specSum)}
	_, err = Desired(a.Config, &m.Spec.Node, nil)
	for _, want := range []string{"spec.node.kubernetesRelease.kubeletSHA256", specSum, "kubernetes.release.kubelet_sha256", hostSum} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("contradicting pins: %v, want an error containing %q", err, want)
		}
	}
	// A malformed spec digest (the CRD refuses it first) is named by its field.
	m.Spec.Node.KubernetesVersion = "1.37.1"
	m.Spec.Node.KubernetesRelease.KubeletSHA256 = "XYZ"
	if _, err := Desired(a.Config, &m.Spec.Node, nil); err == nil || !strings.Contains(err.Error(), "spec.node.kubernetesRelease.kubeletSHA256") || !strings.Contains(err.Error(), "XYZ") {
		t.Errorf("bad spec digest: %v", err)
	}
}

// The Machine reports the version the Node's kubelet reports.
func TestAppliedSummaryVersionFromNode(t *testing.T) {
	a := applied(t)
	if got := appliedSummary(a, "v1.36.3").KubernetesVersion; got != "1.36.3" {
		t.Errorf("version %q, want the Node's 1.36.3", got)
	}
	if got := appliedSummary(a, "").KubernetesVersion; got != a.Config.Kubernetes.Version {
		t.Errorf("no Node: version %q, want the applied %q", got, a.Config.Kubernetes.Version)
	}
}

// TestAppliedSummaryRoundTrips: the summary the watcher reports equals the
// Machine's status as the API returns it, so an idle watcher's decisions
// (a Node status update, every 5 minutes at least) find nothing to write.
// An applied time with nanoseconds would make each of them a GET and a
// no-op PATCH (counted at the apiserver by TestWatcherIdleOnRig).
func TestAppliedSummaryRoundTrips(t *testing.T) {
	a := applied(t)
	a.AppliedAt = time.Date(2026, 12, 3, 10, 0, 0, 123456789, time.UTC)
	s := appliedSummary(a, "v1.37.2")
	data, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var back v1alpha1.AppliedConfig
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(s, &back) {
		t.Errorf("the summary changes through the API:\n%+v\n%+v", s, &back)
	}
}

// TestDesiredDevices: the Machine's devices replace the host's GPUs and
// paths (so the fingerprint changes and the host repaves), absent keeps
// them, and a bad path is refused naming the spec field and the value.
func TestDesiredDevices(t *testing.T) {
	a := applied(t)
	a.Config.Node.Devices.NVIDIADriverDirs = []string{"/opt/nvidia/lib"}
	a.Config.Node.Devices.Allowed = []string{"/dev/fuse", "/dev/nvidia*"}
	m := NewMachine("m1", node, a)
	same, err := Desired(a.Config, &m.Spec.Node, nil)
	if err != nil || same.Fingerprint() != a.Config.Fingerprint() {
		t.Fatalf("no spec devices: %v, fingerprint changed %v", err, err == nil && same.Fingerprint() != a.Config.Fingerprint())
	}
	m.Spec.Node.Devices = &v1alpha1.Devices{GPUs: v1alpha1.GPUsNVIDIA, Paths: []v1alpha1.DevicePath{"/dev/fuse"}}
	d, err := Desired(a.Config, &m.Spec.Node, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Node.Devices.NVIDIA() || len(d.Node.Devices.Paths) != 1 || d.Node.Devices.Paths[0] != "/dev/fuse" ||
		d.Node.Devices.DriverDirs()[0] != "/opt/nvidia/lib" {
		t.Errorf("desired devices %+v", d.Node.Devices)
	}
	if d.Fingerprint() == a.Config.Fingerprint() {
		t.Error("spec devices leave the fingerprint: the host would not repave")
	}
	if a.Config.Node.Devices.GPUs != "" || a.Config.Node.Devices.Paths != nil {
		t.Error("Desired changed the applied configuration")
	}
	m.Spec.Node.Devices = &v1alpha1.Devices{GPUs: v1alpha1.GPUsNone}
	if d, err := Desired(a.Config, &m.Spec.Node, nil); err != nil || d.Node.Devices.NVIDIA() {
		t.Errorf("gpus None: %v %+v", err, d)
	}
	m.Spec.Node.Devices = &v1alpha1.Devices{Paths: []v1alpha1.DevicePath{"/dev/../etc/shadow"}}
	if _, err := Desired(a.Config, &m.Spec.Node, nil); err == nil || !strings.Contains(err.Error(), "spec.node.devices.paths[0]") ||
		!strings.Contains(err.Error(), "/dev/../etc/shadow") {
		t.Errorf("bad device path: %v", err)
	}
}

// An Update operation's in-place request carries the desired configuration
// (the repaver's patch path) and no drain policy matters to it; its repave
// request carries it too.
func TestUpdateOperationCarriesTheSpec(t *testing.T) {
	in := base(t)
	newPatch(&in)
	in.Machine.Spec.UpdatePolicy = v1alpha1.UpdateOnNodeDelete
	in.Operations = []v1alpha1.MachineOperation{op("up", v1alpha1.OperationUpdate, "m1")}
	var req *requests.Request
	for _, a := range Decide(in) {
		if a.Type == WriteRequest {
			req = a.Request
		}
	}
	if req == nil || req.Kind != requests.Restart || req.Desired == nil || req.Desired.Kubernetes.Version != in.Machine.Spec.Node.KubernetesVersion ||
		req.Operation != "up" {
		t.Fatalf("request %+v", req)
	}
}
