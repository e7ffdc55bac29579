package watcher

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/kuberelease"
	"github.com/kubeslot/kubeslot/lib/requests"
)

// The spec's own change: when it applies (updatePolicy), and how (updateMethod:
// in place for a Kubernetes patch release, else a repave).

// repaveCondition compares the spec with the applied configuration: the
// condition to report and, when the update policy lets it go now, the
// spec-driven repave request to write.
func repaveCondition(in Inputs, m *v1alpha1.Machine, desired *config.Config, specErr error) (metav1.Condition, *requests.Request) {
	switch {
	case specErr != nil:
		return cond(v1alpha1.ConditionDegraded, true, v1alpha1.ReasonInvalidSpec,
			"Machine spec refused, nothing dispatched: "+specErr.Error(), m.Generation), nil
	case desired.Fingerprint() == in.Applied.Config.Fingerprint():
		return cond(v1alpha1.ConditionRepavePending, false, v1alpha1.ReasonUpToDate, "the node runs the desired configuration", m.Generation), nil
	case m.Spec.Paused:
		return cond(v1alpha1.ConditionRepavePending, true, v1alpha1.ReasonPaused, "the spec changed; clear spec.paused to repave", m.Generation), nil
	case m.Spec.UpdatePolicy != v1alpha1.UpdateImmediate && (!in.NodeSynced || in.NodeExists):
		return cond(v1alpha1.ConditionRepavePending, true, v1alpha1.ReasonWaitingForNodeDel,
			"the spec changed; cordon, drain and delete Node "+in.NodeName+" to repave", m.Generation), nil
	}
	reason := fmt.Sprintf("Machine %s generation %d asks for configuration %s, slot %s runs %s", m.Name, m.Generation,
		short(desired.Fingerprint()), in.Applied.Slot, short(in.Applied.Config.Fingerprint()))
	method := m.Spec.UpdateMethod
	if method == "" {
		method = v1alpha1.UpdateAuto
	}
	inPlace, why := kuberelease.InPlace(in.Applied.Config, desired)
	switch {
	case inPlace && method != v1alpha1.UpdateRepave:
		// The kubelet replaced in the running node: no drain, the
		// containers keep running (the repaver's in-place path).
		r := &requests.Request{
			Kind: requests.Restart, ID: requests.NewID(requests.Restart, m.Generation, ""), MachineGeneration: m.Generation,
			Reason: reason + ": in place, " + why, Desired: desired,
		}
		return cond(v1alpha1.ConditionRepavePending, true, ReasonDispatchedInPlace,
			fmt.Sprintf("in place (spec.updateMethod %s): %s, so the kubelet is replaced in the running node, no drain, containers keep running", method, why),
			m.Generation), r
	case method == v1alpha1.UpdateInPlace:
		return cond(v1alpha1.ConditionRepavePending, true, v1alpha1.ReasonInPlaceNotPossible,
			"spec.updateMethod InPlace, but "+why+": only a Kubernetes patch release with nothing else changed goes in place; nothing applied (set Auto or Repave to repave)",
			m.Generation), nil
	}
	r := &requests.Request{
		Kind: requests.Repave, ID: requests.NewID(requests.Repave, m.Generation, ""), MachineGeneration: m.Generation,
		Reason: reason, Desired: desired, Disruption: disruptionOf(m),
	}
	return cond(v1alpha1.ConditionRepavePending, true, ReasonDispatched,
		fmt.Sprintf("repave requested (spec.updateMethod %s): %s", method, repaveWhy(method, why)), m.Generation), r
}

// repaveWhy says why a change repaves: forced, or what keeps it from going
// in place.
func repaveWhy(method v1alpha1.UpdateMethod, inPlaceWhy string) string {
	if method == v1alpha1.UpdateRepave {
		return "every change repaves"
	}
	return inPlaceWhy
}

// updateKind is how an Update operation applies m's spec to this host: in
// place (a restart request that carries the desired configuration: the
// repaver's patch path, which only waits for the node when the host runs
// it already, and refuses, naming why, what cannot go in place under
// spec.updateMethod InPlace), or by a repave.
func updateKind(m *v1alpha1.Machine, applied, desired *config.Config) requests.Kind {
	if desired.Fingerprint() == applied.Fingerprint() {
		return requests.Restart
	}
	inPlace, _ := kuberelease.InPlace(applied, desired)
	switch m.Spec.UpdateMethod {
	case v1alpha1.UpdateRepave:
		return requests.Repave
	case v1alpha1.UpdateInPlace:
		return requests.Restart
	}
	if inPlace {
		return requests.Restart
	}
	return requests.Repave
}
