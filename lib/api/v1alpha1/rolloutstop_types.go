package v1alpha1

import (
	"fmt"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RolloutStop is the emergency stop of every rollout in the cluster: while
// one exists (any name), no agent takes a rollout slot, and a slot taken but
// not yet acted on goes back; work already dispatched finishes. Delete every
// RolloutStop to resume. Only cluster admins write it: the agents may only
// read it, so no node can stop or resume the fleet's rollouts.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,categories=kubeslot
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.spec.reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type RolloutStop struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec says why the rollouts are stopped.
	// +optional
	Spec RolloutStopSpec `json:"spec,omitempty"`
}

// RolloutStopList is a list of RolloutStops.
//
// +kubebuilder:object:root=true
type RolloutStopList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []RolloutStop `json:"items"`
}

// RolloutStopSpec says why the rollouts are stopped.
type RolloutStopSpec struct {
	// Reason is shown in the waiting entries of every stopped rollout.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Reason string `json:"reason,omitempty"`
}

// StopMessage is what the waiting targets of a rollout say while stops
// exist ("" when there is none): the first by name, and how many others.
func StopMessage(stops []RolloutStop) string {
	if len(stops) == 0 {
		return ""
	}
	names := make([]string, len(stops))
	byName := map[string]string{}
	for i := range stops {
		names[i] = stops[i].Name
		byName[stops[i].Name] = stops[i].Spec.Reason
	}
	sort.Strings(names)
	msg := fmt.Sprintf("stopped: RolloutStop %s exists", names[0])
	if r := byName[names[0]]; r != "" {
		msg += " (" + r + ")"
	}
	if len(names) > 1 {
		msg += fmt.Sprintf(" and %d more", len(names)-1)
	}
	return msg + "; delete every RolloutStop to resume"
}
