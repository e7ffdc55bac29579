package watcher

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// The watcher reads one field of its Node and writes Events, nothing else of
// the core API. It decodes and encodes them through the small types below
// rather than k8s.io/api/core/v1: that package is ~1.9 MB of code, its init
// and scheme registration touch much of it, and its Node would be cached
// whole (images, conditions, addresses). Field names and JSON tags are the
// core API's, so what is sent and read is the same (core_test.go compares).

// coreGroupVersion is the core API's group version, "v1".
var coreGroupVersion = schema.GroupVersion{Version: "v1"}

// coreNode is what the watcher needs of a Node: that it exists, the
// kubelet version its kubelet posts, and a cordon kubeslot left. The decoder drops everything else the
// apiserver sends.
type coreNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              coreNodeSpec   `json:"spec,omitempty"`
	Status            coreNodeStatus `json:"status,omitempty"`
}

// coreNodeSpec: whether the Node is cordoned (a cordon kubeslot left).
type coreNodeSpec struct {
	Unschedulable bool `json:"unschedulable,omitempty"`
}

type coreNodeStatus struct {
	NodeInfo coreNodeInfo `json:"nodeInfo,omitempty"`
	// Addresses are checked against the host's (nodeaddr.go).
	Addresses []coreNodeAddress `json:"addresses,omitempty"`
}

type coreNodeAddress struct {
	Type    string `json:"type"`
	Address string `json:"address"`
}

type coreNodeInfo struct {
	KubeletVersion string `json:"kubeletVersion,omitempty"`
}

// DeepCopyObject makes coreNode a runtime.Object.
func (n *coreNode) DeepCopyObject() runtime.Object {
	out := &coreNode{TypeMeta: n.TypeMeta, Spec: n.Spec, Status: n.Status}
	out.Status.Addresses = append([]coreNodeAddress(nil), n.Status.Addresses...)
	n.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	return out
}

// coreNodeList is the list the Node informer decodes.
type coreNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []coreNode `json:"items"`
}

// DeepCopyObject makes coreNodeList a runtime.Object.
func (l *coreNodeList) DeepCopyObject() runtime.Object {
	out := &coreNodeList{TypeMeta: l.TypeMeta}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]coreNode, len(l.Items))
		for i := range l.Items {
			out.Items[i] = *l.Items[i].DeepCopyObject().(*coreNode)
		}
	}
	return out
}

// Event types (the core API's EventTypeNormal and EventTypeWarning).
const (
	eventTypeNormal  = "Normal"
	eventTypeWarning = "Warning"
)

// coreEvent is the core API's Event, with the fields the watcher sets.
type coreEvent struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	InvolvedObject    coreObjectReference `json:"involvedObject"`
	Reason            string              `json:"reason,omitempty"`
	Message           string              `json:"message,omitempty"`
	Source            coreEventSource     `json:"source,omitempty"`
	FirstTimestamp    metav1.Time         `json:"firstTimestamp,omitempty"`
	LastTimestamp     metav1.Time         `json:"lastTimestamp,omitempty"`
	Count             int32               `json:"count,omitempty"`
	Type              string              `json:"type,omitempty"`
	// Unset, and sent as the core API's type sends them unset.
	EventTime           metav1.MicroTime `json:"eventTime,omitempty"`
	ReportingController string           `json:"reportingComponent"`
	ReportingInstance   string           `json:"reportingInstance"`
}

// coreObjectReference is the core API's ObjectReference.
type coreObjectReference struct {
	Kind            string    `json:"kind,omitempty"`
	Namespace       string    `json:"namespace,omitempty"`
	Name            string    `json:"name,omitempty"`
	UID             types.UID `json:"uid,omitempty"`
	APIVersion      string    `json:"apiVersion,omitempty"`
	ResourceVersion string    `json:"resourceVersion,omitempty"`
}

// coreEventSource is the core API's EventSource.
type coreEventSource struct {
	Component string `json:"component,omitempty"`
	Host      string `json:"host,omitempty"`
}

// DeepCopyObject makes coreEvent a runtime.Object.
func (e *coreEvent) DeepCopyObject() runtime.Object {
	out := *e
	e.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	e.FirstTimestamp.DeepCopyInto(&out.FirstTimestamp)
	e.LastTimestamp.DeepCopyInto(&out.LastTimestamp)
	e.EventTime.DeepCopyInto(&out.EventTime)
	return &out
}

// corePod is what a rollout's health gate needs of a pod on this node:
// its phase and whether it is Ready.
type corePod struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Status            corePodStatus `json:"status,omitempty"`
}

type corePodStatus struct {
	Phase      string             `json:"phase,omitempty"`
	Conditions []corePodCondition `json:"conditions,omitempty"`
}

type corePodCondition struct {
	Type   string `json:"type"`
	Status string `json:"status"`
}

// DeepCopyObject makes corePod a runtime.Object.
func (p *corePod) DeepCopyObject() runtime.Object {
	out := &corePod{TypeMeta: p.TypeMeta, Status: p.Status}
	out.Status.Conditions = append([]corePodCondition(nil), p.Status.Conditions...)
	p.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	return out
}

// corePodList is the list the health gate decodes.
type corePodList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []corePod `json:"items"`
}

// DeepCopyObject makes corePodList a runtime.Object.
func (l *corePodList) DeepCopyObject() runtime.Object {
	out := &corePodList{TypeMeta: l.TypeMeta}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	for i := range l.Items {
		out.Items = append(out.Items, *l.Items[i].DeepCopyObject().(*corePod))
	}
	return out
}

// coreScheme knows the core kinds above and metav1's options, status
// and watch events.
func coreScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	s.AddKnownTypeWithName(coreGroupVersion.WithKind("Node"), &coreNode{})
	s.AddKnownTypeWithName(coreGroupVersion.WithKind("NodeList"), &coreNodeList{})
	s.AddKnownTypeWithName(coreGroupVersion.WithKind("Event"), &coreEvent{})
	s.AddKnownTypeWithName(coreGroupVersion.WithKind("Pod"), &corePod{})
	s.AddKnownTypeWithName(coreGroupVersion.WithKind("PodList"), &corePodList{})
	metav1.AddToGroupVersion(s, coreGroupVersion)
	return s
}

// newCoreClient is a REST client for the core kinds the watcher uses
// (Nodes, Events, and Pods for a health gate). The typed clientset would register every API group of
// Kubernetes in the process, some 10 MB of resident memory for nothing.
func newCoreClient(cfg *rest.Config) (rest.Interface, error) {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &coreGroupVersion
	c.APIPath = "/api"
	c.NegotiatedSerializer = serializer.NewCodecFactory(coreScheme()).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("core API client: %w", err)
	}
	return rc, nil
}

// dropManagedFields is the informers' transform: the watcher never reads
// managedFields, and they are most of a small object's size in the cache.
func dropManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}
