// Package v1alpha1 is kubeslot's cluster API, group kubeslot.dev, version
// v1alpha1: the Machine (what one host should be) and the MachineOperation
// (something one or more hosts should do once), with their deep-copy code,
// registration for client-go, and the manifests that install them: the
// CustomResourceDefinitions under crds/ (generated from these types by
// controller-gen, see generate.go) and the access control under access/
// (written by hand).
//
// Anything may import it: the CLI installs the manifests, the watcher reads
// Machines and operations and publishes their status, tests build objects.
//
// # Who may write what
//
// An agent acts with its node's identity: the kubelet client certificate
// kept in the host root, user "system:node:<spec.nodeName>" in group
// "system:nodes" (AgentUsername, NodesGroup). Not a dedicated identity,
// because the node identity already exists on every host (TLS bootstrap
// creates it, the kubelet rotates it, bootstrap keeps it in the host root),
// it names the node, which is exactly what ties a host to its Machine
// (spec.nodeName), and it needs no second credential to issue, approve,
// rotate and revoke. Its cost: every node of the cluster, kubeslot's or not,
// gets the agent's (read) grant, so a Machine spec must hold no secret.
//
// The ClusterRole in access/ lets group system:nodes read Machines and
// operations, create Machines and update the status subresource of both;
// nothing else (no update or delete of the objects). The
// ValidatingAdmissionPolicies in access/ narrow that, for node identities
// only, to: create only a Machine whose spec.nodeName is the node's own (and
// only while the node has none); update the status of only that Machine;
// write into an operation's status only entries under the node's own name,
// for its own Machine, on operations that target it. Cluster admins are not
// affected. An admission policy cannot look objects up except through
// parameters, so the policy for operations takes every Machine as a
// parameter; see access/policies.yaml for what that can and cannot prove.
//
// +groupName=kubeslot.dev
// +kubebuilder:object:generate=true
package v1alpha1
