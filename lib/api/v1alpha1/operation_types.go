package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// MachineOperation asks one Machine (spec.machineRef) or every Machine a
// label selector matches (spec.machineSelector) to do something once:
// restart the node, repave, upgrade or reset the agent. Its spec cannot
// change after creation, except spec.rollout.paused and
// spec.rollout.failureBudget (see Rollout). The agent of each targeted Machine reports its
// progress in status.machines and keeps the summary fields up to date.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,categories=kubeslot,shortName=mop
// +kubebuilder:subresource:status
// +kubebuilder:selectablefield:JSONPath=`.spec.machineRef.name`
// +kubebuilder:selectablefield:JSONPath=`.spec.type`
// +kubebuilder:printcolumn:name="Type",type=string,JSONPath=`.spec.type`
// +kubebuilder:printcolumn:name="Machine",type=string,JSONPath=`.spec.machineRef.name`,description="Target Machine (empty when a selector picks the targets)"
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Done",type=integer,JSONPath=`.status.done`,description="Machines that succeeded"
// +kubebuilder:printcolumn:name="InProgress",type=integer,JSONPath=`.status.inProgress`,description="Machines dispatched and not finished"
// +kubebuilder:printcolumn:name="Waiting",type=integer,JSONPath=`.status.waiting`,description="Machines waiting for a rollout slot"
// +kubebuilder:printcolumn:name="Failed",type=integer,JSONPath=`.status.failed`,description="Machines that failed"
// +kubebuilder:printcolumn:name="Started",type=date,JSONPath=`.status.startTime`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.message`,priority=1
type MachineOperation struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec says what to do, and where. It is immutable but for
	// spec.rollout.paused, spec.rollout.failureBudget and spec.rollout.windows.
	// +required
	Spec MachineOperationSpec `json:"spec"`
	// Status is the progress reported by the targeted Machines' agents.
	// +optional
	Status MachineOperationStatus `json:"status,omitempty"`
}

// MachineOperationList is a list of MachineOperations.
//
// +kubebuilder:object:root=true
type MachineOperationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MachineOperation `json:"items"`
}

// MachineOperationSpec says what to do, and where.
//
// +kubebuilder:validation:XValidation:rule="has(self.machineRef) != has(self.machineSelector)",message="spec.machineRef and spec.machineSelector: set exactly one of them to name the target"
// +kubebuilder:validation:XValidation:rule="self.type != 'AgentUpgrade' || (has(self.parameters) && has(self.parameters.bundleURL) && has(self.parameters.bundleSHA256))",message="spec.parameters.bundleURL and spec.parameters.bundleSHA256 are required when spec.type is AgentUpgrade"
// +kubebuilder:validation:XValidation:rule="self.type == 'AgentUpgrade' || !has(self.parameters)",message="spec.parameters is only for spec.type AgentUpgrade"
// +kubebuilder:validation:XValidation:rule="!has(self.rollout) || has(self.machineSelector)",message="spec.rollout is only for an operation with spec.machineSelector: a spec.machineRef operation has one target"
// +kubebuilder:validation:XValidation:rule="has(self.machineRef) == has(oldSelf.machineRef) && has(self.machineSelector) == has(oldSelf.machineSelector) && has(self.parameters) == has(oldSelf.parameters) && has(self.ttlSecondsAfterFinished) == has(oldSelf.ttlSecondsAfterFinished) && has(self.rollout) == has(oldSelf.rollout)",message="spec is immutable once created but for spec.rollout.paused, spec.rollout.failureBudget and spec.rollout.windows: delete this MachineOperation and create a new one"
type MachineOperationSpec struct {
	// MachineRef names the one Machine to act on. Exactly one of
	// MachineRef and MachineSelector is set.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.machineRef is immutable"
	MachineRef *MachineReference `json:"machineRef,omitempty"`

	// MachineSelector picks the Machines to act on by their labels. It must
	// name at least one label: an empty selector, which would pick every
	// Machine, is refused.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.machineSelector is immutable"
	MachineSelector *MachineSelector `json:"machineSelector,omitempty"`

	// Type is what to do.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.type is immutable"
	Type OperationType `json:"type"`

	// Parameters of the operation; only AgentUpgrade has (and requires)
	// them.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.parameters is immutable"
	Parameters *OperationParameters `json:"parameters,omitempty"`

	// TTLSecondsAfterFinished asks for the operation to be deleted this
	// many seconds after it succeeded or failed (status.completionTime);
	// the agent of a targeted Machine deletes it. Unset: kept until deleted.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.ttlSecondsAfterFinished is immutable"
	TTLSecondsAfterFinished *int32 `json:"ttlSecondsAfterFinished,omitempty"`

	// Rollout paces an operation with a machineSelector: at most
	// maxUnavailable targets at a time, in order, halted after a failure
	// budget is spent, and pausable. Unset: every target acts at once.
	// +optional
	Rollout *Rollout `json:"rollout,omitempty"`
}

// Rollout paces a selector operation across its targets. There is no
// controller: each target's agent takes one of maxUnavailable slots (a
// RolloutLease) before it acts, and holds it until its result is published.
//
// +kubebuilder:validation:XValidation:rule="has(self.maxUnavailable) == has(oldSelf.maxUnavailable) && (!has(self.maxUnavailable) || self.maxUnavailable == oldSelf.maxUnavailable) && has(self.canary) == has(oldSelf.canary) && (!has(self.canary) || self.canary == oldSelf.canary) && has(self.orderByLabel) == has(oldSelf.orderByLabel) && (!has(self.orderByLabel) || self.orderByLabel == oldSelf.orderByLabel) && has(self.soakSeconds) == has(oldSelf.soakSeconds) && (!has(self.soakSeconds) || self.soakSeconds == oldSelf.soakSeconds) && has(self.health) == has(oldSelf.health) && (!has(self.health) || self.health == oldSelf.health)",message="spec.rollout.maxUnavailable, spec.rollout.canary, spec.rollout.orderByLabel, spec.rollout.soakSeconds and spec.rollout.health are immutable; only spec.rollout.paused, spec.rollout.failureBudget and spec.rollout.windows may change"
type Rollout struct {
	// MaxUnavailable is how many targets may be acting at once: a number
	// (at least 1) or a percentage of the targets ("25%", more than 0%
	// and at most 100%), rounded down but never below 1. Default 1.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 : (self.matches('^[0-9]{1,3}%$') && int(self.replace('%', '')) >= 1 && int(self.replace('%', '')) <= 100)",message="spec.rollout.maxUnavailable must be a number of at least 1 or a percentage from 1% to 100%"
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`

	// FailureBudget is how many targets may fail before the rollout halts
	// (status.phase Halted): no target starts once that many have failed;
	// those in progress finish. Raise it to resume a halted rollout, or
	// delete the operation to cancel it. 0 never halts. Default 1 (halt at
	// the first failure).
	// +optional
	// +kubebuilder:validation:Minimum=0
	FailureBudget *int32 `json:"failureBudget,omitempty"`

	// Canary is how many targets go first, one at a time: the others wait
	// until that many have succeeded, then the rollout goes on at
	// maxUnavailable. Which targets: the first in order (orderByLabel,
	// then name).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	Canary int32 `json:"canary,omitempty"`

	// OrderByLabel orders the targets by the value of this label on their
	// Machine (absent sorts first), then by name: a target takes a slot
	// only when it is among the first maxUnavailable of those waiting.
	// Unset (and no canary): any waiting target may take a free slot.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	OrderByLabel string `json:"orderByLabel,omitempty"`

	// SoakSeconds is how long a target keeps its slot after it succeeded,
	// so that the next target starts only that long after it (and the
	// canaries count as done only then). Default 0: no soak.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=86400
	SoakSeconds int32 `json:"soakSeconds,omitempty"`

	// Windows, when set, are the only times a target may start: outside
	// all of them no target takes a slot (one taken goes back); those in
	// progress finish. A target's Machine may narrow this with its own
	// spec.maintenanceWindows. The waiting entries say when the next
	// window opens.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Windows []MaintenanceWindow `json:"windows,omitempty"`

	// Health, when set, is a gate each target passes after its update and
	// before its result counts (and its slot, after any soak, goes back):
	// every pod on its Node Ready, and every check answering. A target
	// that does not pass within the timeout fails, with the reason, and
	// counts against the failure budget. Only NodeRestart and Repave are
	// gated.
	// +optional
	Health *RolloutHealth `json:"health,omitempty"`

	// Paused stops targets from starting; those in progress finish.
	// +optional
	Paused bool `json:"paused,omitempty"`
}

// RolloutHealth is the gate a target passes after its update.
type RolloutHealth struct {
	// TimeoutSeconds bounds the wait for the gate to pass. Default 300.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`
	// HTTPChecks are URLs the target's host must get a 200 from (each
	// request bounded to 10 s), e.g. a Prometheus query through a URL
	// that answers 200 only when no alert fires.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	HTTPChecks []HTTPCheck `json:"httpChecks,omitempty"`
}

// DefaultHealthTimeout is spec.rollout.health.timeoutSeconds when unset.
const DefaultHealthTimeout = 300

// HTTPCheck is one URL a health gate gets.
type HTTPCheck struct {
	// URL is an http or https URL with a host.
	// +required
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() in ['http', 'https'] && size(url(self).getHostname()) > 0",message="must be an http or https URL with a host, e.g. http://prometheus.example:9090/-/healthy"
	URL URL `json:"url"`
}

// MaintenanceWindow is a recurring span of local time in which disruptive
// work may start: on Days (every day when empty), from Start for Duration,
// in TimeZone.
type MaintenanceWindow struct {
	// Days are the days of the week the window opens on; empty: every day.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=7
	Days []Weekday `json:"days,omitempty"`
	// Start is the local time the window opens at, HH:MM (24-hour). A
	// time a daylight-saving change skips opens it an hour later.
	// +required
	// +kubebuilder:validation:Pattern=`^([01][0-9]|2[0-3]):[0-5][0-9]$`
	Start string `json:"start"`
	// Duration is how long the window stays open, in elapsed time: a Go
	// duration from 1m to 168h, e.g. "4h" or "90m". A window may cross
	// midnight.
	// +required
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+(ms|s|m|h))+$') && duration(self) >= duration('1m') && duration(self) <= duration('168h')",message="must be a duration from 1m to 168h, e.g. 4h or 90m"
	Duration string `json:"duration"`
	// TimeZone is the IANA time zone of Start, e.g. "Europe/Berlin".
	// Default UTC. A name the agent's zone database does not know makes
	// the agent refuse the window, naming it.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	TimeZone string `json:"timeZone,omitempty"`
}

// Weekday is a day of the week, in three letters.
//
// +kubebuilder:validation:Enum=Mon;Tue;Wed;Thu;Fri;Sat;Sun
type Weekday string

// MachineReference names a Machine.
type MachineReference struct {
	// Name is the Machine's metadata.name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
}

// MachineSelector selects Machines by label, with the meaning of a
// Kubernetes label selector: all of MatchLabels and all of
// MatchExpressions must hold.
//
// +kubebuilder:validation:XValidation:rule="(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)",message="spec.machineSelector must name at least one label in matchLabels or matchExpressions; an empty selector would pick every Machine"
type MachineSelector struct {
	// MatchLabels are labels the Machine must carry with exactly these
	// values.
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	MatchLabels map[string]string `json:"matchLabels,omitempty"`
	// MatchExpressions are further requirements on the Machine's labels.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	MatchExpressions []SelectorRequirement `json:"matchExpressions,omitempty"`
}

// SelectorRequirement is one requirement on a label.
//
// +kubebuilder:validation:XValidation:rule="(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",message="values must be non-empty for the operators In and NotIn, and empty for Exists and DoesNotExist"
type SelectorRequirement struct {
	// Key is the label key.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	Key string `json:"key"`
	// Operator relates the label's value to Values.
	// +required
	Operator SelectorOperator `json:"operator"`
	// Values for In and NotIn.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	Values []string `json:"values,omitempty"`
}

// SelectorOperator is the operator of a SelectorRequirement.
//
// +kubebuilder:validation:Enum=In;NotIn;Exists;DoesNotExist
type SelectorOperator string

const (
	SelectorIn           SelectorOperator = "In"
	SelectorNotIn        SelectorOperator = "NotIn"
	SelectorExists       SelectorOperator = "Exists"
	SelectorDoesNotExist SelectorOperator = "DoesNotExist"
)

// OperationType is what a MachineOperation does.
//
// +kubebuilder:validation:Enum=NodeRestart;Repave;Update;AgentUpgrade;AgentReset
type OperationType string

const (
	// OperationNodeRestart restarts the node in its current slot.
	OperationNodeRestart OperationType = "NodeRestart"
	// OperationRepave reinstalls the node onto the other slot from the
	// current spec, even if nothing changed.
	OperationRepave OperationType = "Repave"
	// OperationUpdate applies each target's spec the way its
	// spec.updateMethod says (a Kubernetes patch release in place, anything
	// else by a repave; nothing to do is done at once), so a fleet-wide spec
	// change held by updatePolicy OnNodeDelete goes through one paced
	// rollout.
	OperationUpdate OperationType = "Update"
	// OperationAgentUpgrade replaces the agent with the bundle named in
	// the parameters.
	OperationAgentUpgrade OperationType = "AgentUpgrade"
	// OperationAgentReset removes everything kubeslot installed on the host.
	OperationAgentReset OperationType = "AgentReset"
)

// OperationParameters are the parameters of an operation.
type OperationParameters struct {
	// BundleURL is where to download the agent release bundle from
	// (AgentUpgrade): an http or https URL with a host.
	// +optional
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() in ['http', 'https'] && size(url(self).getHostname()) > 0",message="must be an http or https URL with a host, e.g. https://example.com/kubeslot-bundle.tar.gz"
	BundleURL URL `json:"bundleURL,omitempty"`
	// BundleSHA256 is the bundle's sha256 digest; a download that does not
	// match is refused (AgentUpgrade).
	// +optional
	BundleSHA256 SHA256 `json:"bundleSHA256,omitempty"`
}

// MachineOperationStatus is the progress of an operation. Each targeted
// Machine's agent writes its own entry in Machines, then updates the summary
// fields from all entries (see SetMachineResult).
type MachineOperationStatus struct {
	// Phase summarises the entries in Machines: Pending until an agent
	// dispatched the operation, Failed as soon as one target failed (with
	// a rollout: once every entry is finished), InProgress while one is
	// not finished, Succeeded when all are, and Halted when a rollout's
	// failure budget is spent while targets still wait.
	// +optional
	Phase OperationPhase `json:"phase,omitempty"`
	// Done, InProgress, Waiting and Failed count the entries in Machines:
	// succeeded, dispatched and not finished, waiting for a rollout slot,
	// failed.
	// +optional
	Done int32 `json:"done,omitempty"`
	// +optional
	InProgress int32 `json:"inProgress,omitempty"`
	// +optional
	Waiting int32 `json:"waiting,omitempty"`
	// +optional
	Failed int32 `json:"failed,omitempty"`
	// Targets is how many Machines the selector matched when the first
	// agent joined a rollout whose maxUnavailable is a percentage; every
	// agent counts the percentage from it, so all agree on the slots.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Targets int32 `json:"targets,omitempty"`
	// Message says what is happening or what went wrong, for a person.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Message string `json:"message,omitempty"`
	// StartTime is when the first agent started the operation.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// CompletionTime is when the operation finished (phase Succeeded or
	// Failed).
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// ObservedMachineGeneration is the metadata.generation of the target
	// Machine when its agent acted on the operation (single-target
	// operations; see Machines for each target).
	// +optional
	ObservedMachineGeneration int64 `json:"observedMachineGeneration,omitempty"`
	// Conditions Progressing, Complete and Halted summarise the phase for
	// people and for `kubectl wait --for=condition=Complete`.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Machines holds one entry per targeted Machine that picked the
	// operation up, each written only by that Machine's agent. An entry is
	// trustworthy when its machine exists with that nodeName: an agent may
	// write entries under its own node name only, and only for Machines
	// that are its own and that the operation targets (or that do not
	// exist).
	// +optional
	// +listType=map
	// +listMapKey=name
	// +listMapKey=nodeName
	// +kubebuilder:validation:MaxItems=1000
	Machines []MachineOperationTarget `json:"machines,omitempty"`
}

// MachineOperationTarget is one Machine's progress on an operation.
type MachineOperationTarget struct {
	// Name is the Machine's name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// NodeName is the node of the agent that wrote this entry: the
	// Machine's spec.nodeName.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	NodeName string `json:"nodeName"`
	// Phase of the operation on this Machine.
	// +required
	Phase OperationPhase `json:"phase"`
	// Message says what is happening or what went wrong on this Machine.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Message string `json:"message,omitempty"`
	// StartTime is when this Machine's agent started the operation.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// CompletionTime is when it finished on this Machine.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// ObservedMachineGeneration is the Machine's metadata.generation when
	// its agent acted on the operation.
	// +optional
	ObservedMachineGeneration int64 `json:"observedMachineGeneration,omitempty"`
	// RolledBack is set when what this Machine reported Succeeded was
	// undone later: an AgentUpgrade whose new release failed while on
	// probation and was rolled back by the recovery unit. Phase stays
	// Succeeded (that verdict was given); this says it no longer holds.
	// +optional
	RolledBack *OperationRollback `json:"rolledBack,omitempty"`
	// Steps are the worker's steps on this Machine (drain, switch, verify,
	// ...) with their start and duration, as far as its agent published
	// them: the steps done when it reported InProgress, all of them with
	// the result. A last step without a duration was under way.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Steps []OperationStep `json:"steps,omitempty"`
	// OrderKey is the value of the rollout's orderByLabel on this Machine
	// when its agent joined (empty without one): the agents order the
	// waiting entries by it, then by name.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	OrderKey string `json:"orderKey,omitempty"`
}

// OperationStep is one step of a worker on a Machine.
type OperationStep struct {
	// Name is the step's name, e.g. drain, switch, verify.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// StartTime is when the step started (microseconds: a switch takes
	// less than a second).
	// +required
	StartTime metav1.MicroTime `json:"startTime"`
	// DurationMilliseconds is how long it took.
	// +optional
	// +kubebuilder:validation:Minimum=0
	DurationMilliseconds int64 `json:"durationMilliseconds,omitempty"`
}

// OperationRollback records a rollback after a Machine's Succeeded.
type OperationRollback struct {
	// Time is when the rollback was made.
	// +required
	Time metav1.Time `json:"time"`
	// Reason is a CamelCase word: RolledBackOnProbation.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	Reason string `json:"reason"`
	// Message says what failed and which release runs now.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Message string `json:"message,omitempty"`
}

// OperationPhase is the progress of an operation.
//
// +kubebuilder:validation:Enum=Waiting;Pending;InProgress;Succeeded;Failed;Halted
type OperationPhase string

const (
	// OperationWaiting (an entry) waits for a rollout slot: nothing was
	// dispatched on its Machine yet.
	OperationWaiting OperationPhase = "Waiting"
	// OperationHalted (the summary) is a rollout whose failure budget is
	// spent while targets still wait: none of them starts.
	OperationHalted     OperationPhase = "Halted"
	OperationPending    OperationPhase = "Pending"
	OperationInProgress OperationPhase = "InProgress"
	OperationSucceeded  OperationPhase = "Succeeded"
	OperationFailed     OperationPhase = "Failed"
)

// Finished reports whether p is Succeeded or Failed.
func (p OperationPhase) Finished() bool { return p == OperationSucceeded || p == OperationFailed }
