package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Machine is one host that kubeslot runs as a Kubernetes worker: what its
// node should be (spec, written by a cluster admin) and what it is (status,
// written by the host's agent). There is one Machine per host, named after
// the host's machine name. An agent may create only the Machine of its own
// node and update only that Machine's status; see the package comment.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,categories=kubeslot,shortName=ksm
// +kubebuilder:subresource:status
// +kubebuilder:selectablefield:JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeName`,description="Kubernetes node name"
// +kubebuilder:printcolumn:name="Slot",type=string,JSONPath=`.status.activeSlot`,description="Slot whose node is committed"
// +kubebuilder:printcolumn:name="Kubernetes",type=string,JSONPath=`.status.applied.kubernetesVersion`,description="Kubernetes version the active slot runs"
// +kubebuilder:printcolumn:name="Agent",type=string,JSONPath=`.status.agentVersion`,description="kubeslot agent version"
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Desired",type=string,JSONPath=`.spec.node.kubernetesVersion`,priority=1,description="Kubernetes version the spec asks for"
// +kubebuilder:printcolumn:name="Paused",type=boolean,JSONPath=`.spec.paused`,priority=1
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name must be the host's machine name: a DNS-1123 label (at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit)"
type Machine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired state of the host's node.
	// +required
	Spec MachineSpec `json:"spec"`
	// Status is what the host's agent last reported.
	// +optional
	Status MachineStatus `json:"status,omitempty"`
}

// MachineList is a list of Machines.
//
// +kubebuilder:object:root=true
type MachineList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Machine `json:"items"`
}

// MachineSpec is the desired state of a host's node.
type MachineSpec struct {
	// NodeName is the name of the Kubernetes Node the host runs. The host's
	// agent authenticates as "system:node:<nodeName>", which is how the
	// cluster tells it owns this Machine; it cannot change after creation
	// (a different node is a different Machine).
	//
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="must be a DNS-1123 subdomain: dot-separated labels of lowercase letters, digits and '-', at most 253 characters"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="is immutable: a different node is a different Machine; delete this Machine and create a new one"
	NodeName string `json:"nodeName"`

	// Node is the desired configuration of the node. When it differs from
	// what the active slot runs, the agent repaves the host onto the other
	// slot, when UpdatePolicy allows.
	//
	// +required
	Node NodeConfig `json:"node"`

	// Paused stops the agent from acting on spec changes and operations;
	// it keeps reporting status. Use it to hold a host during maintenance.
	//
	// +optional
	Paused bool `json:"paused,omitempty"`

	// UpdatePolicy says when a changed Node configuration is applied.
	//
	// +optional
	// +kubebuilder:default=OnNodeDelete
	UpdatePolicy UpdatePolicy `json:"updatePolicy,omitempty"`

	// UpdateMethod says how a changed Node configuration is applied once
	// UpdatePolicy lets it: Auto picks the least disruptive way, InPlace
	// and Repave force one. In place, the kubelet of a Kubernetes patch
	// release (nothing else changed) replaces the one in the running node,
	// with no drain: the containers keep running. Anything else repaves
	// onto the other slot. InPlace with a change it cannot apply applies
	// nothing and says why in RepavePending.
	//
	// +optional
	// +kubebuilder:default=Auto
	UpdateMethod UpdateMethod `json:"updateMethod,omitempty"`

	// Disruption says how the agent takes the node's pods off it before an
	// operation that stops them (a repave, a restart): cordon, evict
	// through the Eviction API (PodDisruptionBudgets hold), wait, and
	// uncordon once the node is healthy again. It travels with each
	// request and never causes a repave by itself. Absent means the
	// defaults.
	//
	// +optional
	Disruption *Disruption `json:"disruption,omitempty"`

	// MaintenanceWindows, when set, are the only times this Machine takes
	// a rollout slot (see MachineOperation spec.rollout.windows, which
	// this narrows); a rollout waits for both. Empty: any time.
	//
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	MaintenanceWindows []MaintenanceWindow `json:"maintenanceWindows,omitempty"`
}

// Disruption is a Machine's drain policy.
type Disruption struct {
	// Drain is Evict (cordon, then evict the pods through the Eviction API
	// before the node stops) or None (the pods stop with the node, as on a
	// one-node cluster, where evicted pods have nowhere to go and the
	// drain would only lengthen their downtime).
	//
	// +optional
	// +kubebuilder:default=Evict
	Drain DrainMode `json:"drain,omitempty"`

	// DrainTimeoutSeconds bounds the cordon, the evictions and the wait for
	// the evicted pods to go. The agent also keeps the whole operation
	// within its unit's time limit, and says so when that shortens the drain.
	//
	// +optional
	// +kubebuilder:default=120
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1200
	DrainTimeoutSeconds int32 `json:"drainTimeoutSeconds,omitempty"`

	// OnDrainTimeout is what happens when the drain is not done in time:
	// Fail (the operation fails before the node is stopped; a repave rolls
	// back and the node is uncordoned) or Force (the operation goes on; the
	// pods left stop with the node).
	//
	// +optional
	// +kubebuilder:default=Fail
	OnDrainTimeout DrainTimeoutAction `json:"onDrainTimeout,omitempty"`

	// DeleteEmptyDirData lets the drain evict pods with emptyDir volumes,
	// whose data is then lost. Without it such a pod fails the drain at
	// once (Fail) or is left to stop with the node (Force).
	//
	// +optional
	DeleteEmptyDirData bool `json:"deleteEmptyDirData,omitempty"`

	// PDBPreflight is what the agent does, before it cordons anything,
	// about the PodDisruptionBudgets of the node's pods that would hold the
	// drain up (one that never allows a disruption, or one that allows
	// fewer now than it has pods on this node): Warn says so (log, the
	// Draining condition) and drains; Refuse fails the operation naming the
	// budgets and pods, nothing cordoned (in a rollout it counts against
	// the failure budget).
	//
	// +optional
	// +kubebuilder:default=Warn
	PDBPreflight PDBPreflight `json:"pdbPreflight,omitempty"`
}

// PDBPreflight says what a drain's budget check before the cordon does.
//
// +kubebuilder:validation:Enum=Warn;Refuse
type PDBPreflight string

const (
	PDBPreflightWarn   PDBPreflight = "Warn"
	PDBPreflightRefuse PDBPreflight = "Refuse"
)

// DrainMode says whether the node is drained before its pods stop.
//
// +kubebuilder:validation:Enum=Evict;None
type DrainMode string

// Drain modes.
const (
	DrainEvict DrainMode = "Evict"
	DrainNone  DrainMode = "None"
)

// DrainTimeoutAction is what a drain does when its time runs out.
//
// +kubebuilder:validation:Enum=Fail;Force
type DrainTimeoutAction string

// Drain timeout actions.
const (
	DrainTimeoutFail  DrainTimeoutAction = "Fail"
	DrainTimeoutForce DrainTimeoutAction = "Force"
)

// UpdatePolicy says when an agent repaves its host onto a changed node
// configuration.
//
// +kubebuilder:validation:Enum=OnNodeDelete;Immediate
type UpdatePolicy string

const (
	// UpdateOnNodeDelete repaves only after an operator cordoned and
	// drained the node and deleted its Node object, so workloads move on
	// the operator's schedule. Until then the Machine has the condition
	// RepavePending.
	UpdateOnNodeDelete UpdatePolicy = "OnNodeDelete"
	// UpdateImmediate repaves as soon as the spec changes.
	UpdateImmediate UpdatePolicy = "Immediate"
)

// UpdateMethod says how an agent applies a changed node configuration.
//
// +kubebuilder:validation:Enum=Auto;InPlace;Repave
type UpdateMethod string

const (
	// UpdateAuto applies a Kubernetes patch release in place and repaves
	// for anything else.
	UpdateAuto UpdateMethod = "Auto"
	// UpdateInPlace applies only what can be applied in place.
	UpdateInPlace UpdateMethod = "InPlace"
	// UpdateRepave always repaves onto the other slot.
	UpdateRepave UpdateMethod = "Repave"
)

// NodeConfig is the configuration of a host's node: the cluster-side
// counterpart of the [kubernetes], [rootfs] and [artifacts] sections of the
// bootstrap configuration.
type NodeConfig struct {
	// KubernetesVersion is the kubelet's release, MAJOR.MINOR.PATCH without
	// a leading "v", e.g. "1.37.2".
	//
	// +required
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^(0|[1-9][0-9]*)[.](0|[1-9][0-9]*)[.](0|[1-9][0-9]*)$')",message="must be a Kubernetes release MAJOR.MINOR.PATCH without a leading v, e.g. 1.37.2"
	KubernetesVersion string `json:"kubernetesVersion"`

	// RootFS is the node root filesystem image installed into a slot.
	//
	// +required
	RootFS RootFS `json:"rootfs"`

	// Artifacts override binaries installed on top of the root filesystem.
	// An absent entry means: what the host's bootstrap configuration says,
	// or what the root filesystem already has.
	//
	// +optional
	Artifacts *Artifacts `json:"artifacts,omitempty"`

	// Labels are the node's labels, registered by the kubelet. Keys are
	// [prefix/]name; note that the NodeRestriction admission plugin lets a
	// kubelet set only some labels under kubernetes.io and k8s.io.
	//
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) <= 317 && k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$'))",message="keys must be [prefix/]name: an optional DNS subdomain prefix and '/', then at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
	Labels map[string]LabelValue `json:"labels,omitempty"`

	// Taints are the node's taints, registered by the kubelet.
	//
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Taints []Taint `json:"taints,omitempty"`

	// SandboxImage is the pod sandbox ("pause") image the node's containerd
	// runs for every pod, a full reference with registry and tag or digest.
	// Empty means what the host's bootstrap configuration says ([node]
	// sandbox_image, by default the one of the Kubernetes release).
	//
	// +optional
	// +kubebuilder:validation:MaxLength=512
	SandboxImage string `json:"sandboxImage,omitempty"`

	// KubernetesRelease is the release mirror the kubelet of
	// kubernetesVersion comes from, when artifacts.kubelet does not name
	// one file. Absent means the host's [kubernetes.release].
	//
	// +optional
	KubernetesRelease *KubernetesRelease `json:"kubernetesRelease,omitempty"`

	// Devices are the host devices passed into the node beyond /dev/kvm
	// (always passed when the host has it). Absent means what the host's
	// bootstrap configuration says ([node.devices]); present, it replaces
	// that. The node advertises them to pods through device plugins the
	// cluster runs (e.g. NVIDIA's k8s-device-plugin DaemonSet).
	//
	// +optional
	Devices *Devices `json:"devices,omitempty"`

	// Kubelet sets the node's kubelet configuration beyond what kubeslot
	// sets. Absent means what the host's bootstrap configuration says
	// ([node.kubelet]); present, it replaces that.
	//
	// +optional
	Kubelet *Kubelet `json:"kubelet,omitempty"`
}

// Kubelet is a Machine's layer over kubeslot's kubelet configuration.
type Kubelet struct {
	// Config holds keys of the kubelet's configuration file
	// (KubeletConfiguration, kubelet.config.k8s.io/v1beta1) by their names
	// there, each replacing kubeslot's value of that key, e.g. {"maxPods":
	// 150, "evictionHard": {"memory.available": "200Mi"},
	// "shutdownGracePeriod": "30s"}. The agent refuses unknown keys (names
	// are case-sensitive), values of the wrong type, and the keys kubeslot
	// owns: the kubelet API's security and ports, the hardened values of the
	// CIS benchmark, the cgroup profile, and the cluster DNS, taints and
	// reservations, which have settings of their own. The Machine is then
	// Degraded (InvalidSpec), naming the key.
	//
	// +optional
	Config *runtime.RawExtension `json:"config,omitempty"`
}

// Devices are host devices a Machine passes into its node.
type Devices struct {
	// GPUs is None or NVIDIA: bind the host's NVIDIA device nodes
	// (/dev/nvidia*, /dev/nvidia-caps/*) and the driver's libraries and
	// binaries (read-only) into the node. A host without a loaded driver
	// fails the repave, naming what is missing. NVIDIA is refused
	// (Degraded) unless the host's own configuration sets gpus = "nvidia"
	// or its node.devices.allowed matches /dev/nvidiactl.
	//
	// +optional
	// +kubebuilder:validation:Enum=None;NVIDIA
	GPUs GPUKind `json:"gpus,omitempty"`

	// Paths are further device nodes (char or block) under /dev, bound at
	// the same path and allowed read-write, e.g. /dev/fuse. Each must exist
	// on the host and be matched by its [node.devices] allowed patterns;
	// /dev/mem, /dev/kmem, /dev/port and block devices only when that list
	// names them exactly.
	//
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	Paths []DevicePath `json:"paths,omitempty"`
}

// GPUKind says which GPUs a node gets.
type GPUKind string

// GPU kinds.
const (
	GPUsNone   GPUKind = "None"
	GPUsNVIDIA GPUKind = "NVIDIA"
)

// DevicePath is a device node under /dev.
//
// +kubebuilder:validation:MaxLength=255
// +kubebuilder:validation:XValidation:rule="self.matches('^/dev(/[A-Za-z0-9_.+-]+)+$') && !self.contains('/./') && !self.contains('/../') && !self.endsWith('/.') && !self.endsWith('/..')",message="must be a device node under /dev: letters, digits, '/', '_', '.', '+' and '-', no '.' or '..' parts, e.g. /dev/fuse"
type DevicePath string

// KubernetesRelease is a mirror laid out like the upstream release
// downloads: <mirror>/v<version>/bin/linux/<arch>/kubelet, with the file's
// sha256 published beside it as kubelet.sha256, which is always checked
// when present. That digest guards against a corrupted download only: the
// mirror serves it too. KubeletSHA256 is the digest held by whoever writes
// the spec.
type KubernetesRelease struct {
	// Mirror is the base URL, e.g. https://dl.k8s.io/release. It must be
	// https: over plain http the network picks both the kubelet, which runs
	// as root, and its digest.
	//
	// +required
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() == 'https' && size(url(self).getHostname()) > 0 && !self.contains('?') && !self.contains('#')",message="must be an https URL with a host and no query, e.g. https://dl.k8s.io/release"
	Mirror URL `json:"mirror"`
	// CAPEM is the PEM CA that signs an https mirror's certificate, when
	// the host's system roots do not.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=65536
	CAPEM string `json:"caPEM,omitempty"`
	// KubeletSHA256 pins the digest of the kubelet of kubernetesVersion:
	// the download is checked against it, and the mirror's kubelet.sha256,
	// when there is one, must agree. It must also agree with a pin the
	// host's configuration holds for that version.
	//
	// +optional
	KubeletSHA256 SHA256 `json:"kubeletSHA256,omitempty"`
}

// LabelValue is the value of a node label. (A type of its own so that the
// schema can bound its length, which its CEL rule needs.)
//
// +kubebuilder:validation:MaxLength=63
// +kubebuilder:validation:XValidation:rule="self.matches('^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$')",message="must be empty or at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
type LabelValue string

// RootFS is a root filesystem image to download and verify.
type RootFS struct {
	// Source is where to get the image: an http or https URL of a tarball,
	// or an OCI image "oci://<registry host>/<repository>[:<tag>]" (a
	// "@sha256:<digest>" may follow; it must equal sha256), the same sources
	// as the [rootfs] section of the bootstrap configuration.
	// +required
	// +kubebuilder:validation:XValidation:rule="self.startsWith('oci://') || (isURL(self) && url(self).getScheme() in ['http', 'https'] && size(url(self).getHostname()) > 0)",message="must be an http or https URL with a host (e.g. https://example.com/rootfs.tar.zst) or an OCI image oci://<registry host>/<repository>[:<tag>]"
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('oci://') || self.matches('^oci://(localhost|[^/@?#]*[.:][^/@?#]*)(/[a-z0-9]+([._-]+[a-z0-9]+)*)+(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$')",message="an OCI image source must be oci://<registry host>/<repository>[:<tag>][@sha256:<digest>]: the host has a dot or a port or is localhost, the repository is lowercase"
	Source URL `json:"source"`
	// SHA256 is the image's sha256 digest; a download that does not match
	// is refused. For an OCI image it is the manifest (or index) digest,
	// which is what is pulled.
	// +required
	SHA256 SHA256 `json:"sha256"`
}

// Artifact is one binary or archive to download and verify.
type Artifact struct {
	// URL is where to download the artifact from: an http or https URL
	// with a host.
	// +required
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() in ['http', 'https'] && size(url(self).getHostname()) > 0",message="must be an http or https URL with a host, e.g. https://example.com/kubelet"
	URL URL `json:"url"`
	// SHA256 is the artifact's sha256 digest; a download that does not
	// match is refused.
	// +required
	SHA256 SHA256 `json:"sha256"`
}

// Artifacts are the binaries a Machine may override.
type Artifacts struct {
	// Kubelet is the kubelet binary.
	// +optional
	Kubelet *Artifact `json:"kubelet,omitempty"`
	// Containerd is the containerd release archive.
	// +optional
	Containerd *Artifact `json:"containerd,omitempty"`
	// Runc is the runc binary.
	// +optional
	Runc *Artifact `json:"runc,omitempty"`
	// CNIPlugins is the CNI plugins release archive.
	// +optional
	CNIPlugins *Artifact `json:"cniPlugins,omitempty"`
}

// MachineStatus is what a host's agent last reported.
type MachineStatus struct {
	// ObservedGeneration is the metadata.generation of the spec the agent
	// last acted on. While it is below metadata.generation, the agent has
	// not seen the latest spec yet.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Phase is a one-word summary of the host; Conditions say why.
	// +optional
	Phase MachinePhase `json:"phase,omitempty"`

	// ActiveSlot is the slot whose node passed verification and was
	// committed, e.g. "a" or "b".
	// +optional
	// +kubebuilder:validation:MaxLength=16
	ActiveSlot string `json:"activeSlot,omitempty"`

	// Applied summarises the configuration the active slot runs.
	// +optional
	Applied *AppliedConfig `json:"applied,omitempty"`

	// AgentVersion is the release of the kubeslot agent running on the host.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	AgentVersion string `json:"agentVersion,omitempty"`

	// Conditions are the detailed state of the host, one per type (see the
	// Condition* constants), with reasons and messages a person can act on.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// AppliedConfig summarises a configuration a slot was provisioned with. It
// never holds a secret.
type AppliedConfig struct {
	// KubernetesVersion is the kubelet release the slot runs.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	KubernetesVersion string `json:"kubernetesVersion,omitempty"`
	// RootFSSHA256 is the digest of the root filesystem image in the slot.
	// +optional
	RootFSSHA256 SHA256 `json:"rootfsSHA256,omitempty"`
	// Summary is a one-line description, as `kubeslot status` prints it.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Summary string `json:"summary,omitempty"`
	// Fingerprint is the sha256 of the configuration's canonical form: equal
	// for configurations that install the same thing.
	// +optional
	Fingerprint SHA256 `json:"fingerprint,omitempty"`
	// AppliedAt is when the slot was committed.
	// +optional
	AppliedAt *metav1.Time `json:"appliedAt,omitempty"`
}

// MachinePhase is a one-word summary of a host.
//
// +kubebuilder:validation:Enum=Pending;Bootstrapping;Ready;Repaving;Upgrading;Resetting;Degraded
type MachinePhase string

const (
	// MachinePending: no agent has reported yet.
	MachinePending MachinePhase = "Pending"
	// MachineBootstrapping: the agent is installing the first slot.
	MachineBootstrapping MachinePhase = "Bootstrapping"
	// MachineReady: the active slot's node is Ready and matches the spec
	// (or waits for the update policy to allow a repave).
	MachineReady MachinePhase = "Ready"
	// MachineRepaving: the host is moving onto the other slot.
	MachineRepaving MachinePhase = "Repaving"
	// MachineUpgrading: the agent is replacing itself.
	MachineUpgrading MachinePhase = "Upgrading"
	// MachineResetting: the agent is removing everything it installed.
	MachineResetting MachinePhase = "Resetting"
	// MachineDegraded: something needs a person; the Degraded condition
	// says what.
	MachineDegraded MachinePhase = "Degraded"
)

// Condition types of a Machine.
const (
	// ConditionAgentBootstrapped is True once the first slot was committed.
	ConditionAgentBootstrapped = "AgentBootstrapped"
	// ConditionReady is True while the active slot's node is Ready.
	ConditionReady = "Ready"
	// ConditionRepavePending is True while the spec differs from the
	// active slot and the repave waits (for the Node to be deleted under
	// OnNodeDelete, for Paused to be cleared, or for the lock).
	ConditionRepavePending = "RepavePending"
	// ConditionRepaved reports the outcome of the last repave.
	ConditionRepaved = "Repaved"
	// ConditionAgentUpgraded reports the outcome of the last agent upgrade.
	ConditionAgentUpgraded = "AgentUpgraded"
	// ConditionDegraded is True while the host needs a person.
	ConditionDegraded = "Degraded"
	// ConditionDraining is True while the agent drains the node before an
	// operation that stops its pods (pods left, the blocking
	// PodDisruptionBudget named); False with how the last drain ended.
	ConditionDraining = "Draining"
)

// Condition reasons. Each says what happened in a way that points at what to
// do; the message carries the details.
const (
	ReasonBootstrapped      = "Bootstrapped"
	ReasonBootstrapFailed   = "BootstrapFailed"
	ReasonNodeReady         = "NodeReady"
	ReasonNodeNotReady      = "NodeNotReady"
	ReasonWaitingForNodeDel = "WaitingForNodeDeletion" // cordon, drain and delete the Node to proceed
	ReasonPaused            = "Paused"                 // clear spec.paused to proceed
	ReasonUpToDate          = "UpToDate"
	ReasonRepaved           = "Repaved"
	ReasonRepaveFailed      = "RepaveFailed" // rolled back to the old slot; see the message
	// ReasonPatchedInPlace: the kubelet of a patch release replaced the
	// running one in place (spec.updateMethod); ReasonPatchFailed: it did
	// not, and the node runs the old kubelet again.
	ReasonPatchedInPlace = "PatchedInPlace"
	ReasonPatchFailed    = "PatchFailed"
	// ReasonInPlaceNotPossible: spec.updateMethod InPlace, and the change
	// is not one the in-place path applies; nothing is applied.
	ReasonInPlaceNotPossible = "InPlaceNotPossible"
	ReasonUpgraded           = "Upgraded"
	ReasonUpgradeFailed      = "UpgradeFailed" // rolled back to the last good release
	// ReasonRolledBackOnProbation: the upgrade was reported Upgraded, then
	// the new release failed while on probation and the recovery unit
	// rolled it back to the last good release.
	ReasonRolledBackOnProbation = "RolledBackOnProbation"
	ReasonDownloadFailed        = "DownloadFailed"
	ReasonChecksumMismatch      = "ChecksumMismatch" // the spec's sha256 does not match what the URL serves
	ReasonInvalidSpec           = "InvalidSpec"
	ReasonHealthy               = "Healthy"
	ReasonDraining              = "Draining"
	ReasonDrainBlocked          = "DrainBlocked" // a PodDisruptionBudget refuses an eviction; the message names it
	ReasonDrained               = "Drained"
	ReasonDrainFailed           = "DrainFailed" // not done in time under onDrainTimeout Fail, or pods it may not evict
	ReasonDrainForced           = "DrainForced" // not done in time; went on under onDrainTimeout Force
)
