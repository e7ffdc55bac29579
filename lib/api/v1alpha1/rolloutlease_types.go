package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RolloutLease is one slot of a MachineOperation's rollout: the agent named
// in spec.holderIdentity may act on its Machine while it renews the lease.
// Its fields are coordination.k8s.io/v1 Lease's; it is a kubeslot resource
// because the NodeRestriction admission plugin lets a node identity, which
// is what an agent runs as, write only the Lease named after itself in
// kube-node-lease. Slot i of operation op is named "<op>-<i>", labelled
// with LabelOperation, and owned by the operation (deleted with it).
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,categories=kubeslot,shortName=rl
// +kubebuilder:printcolumn:name="Holder",type=string,JSONPath=`.spec.holderIdentity`
// +kubebuilder:printcolumn:name="Renewed",type=date,JSONPath=`.spec.renewTime`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type RolloutLease struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is who holds the slot, and until when.
	// +required
	Spec RolloutLeaseSpec `json:"spec"`
}

// RolloutLeaseList is a list of RolloutLeases.
//
// +kubebuilder:object:root=true
type RolloutLeaseList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []RolloutLease `json:"items"`
}

// RolloutLeaseSpec is a Lease's spec.
type RolloutLeaseSpec struct {
	// HolderIdentity is the node name of the agent holding the slot.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	HolderIdentity string `json:"holderIdentity"`
	// LeaseDurationSeconds is how long after renewTime others wait before
	// they take the slot over (counted on their own clock from when they
	// last saw the lease change).
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	LeaseDurationSeconds int32 `json:"leaseDurationSeconds"`
	// AcquireTime is when the holder took the slot.
	// +optional
	AcquireTime *metav1.MicroTime `json:"acquireTime,omitempty"`
	// RenewTime is when the holder last renewed it.
	// +optional
	RenewTime *metav1.MicroTime `json:"renewTime,omitempty"`
	// LeaseTransitions counts the holders that took it over.
	// +optional
	// +kubebuilder:validation:Minimum=0
	LeaseTransitions int32 `json:"leaseTransitions,omitempty"`
}

// LabelOperation labels a RolloutLease with its operation's name.
const LabelOperation = "kubeslot.dev/operation"
