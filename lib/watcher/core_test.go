package watcher

import (
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
)

// The tests may link k8s.io/api/core/v1: they check the watcher's small core
// types against it, so that what it reads and writes is the core API's.

func TestCoreNodeDecodesWhatTheWatcherReads(t *testing.T) {
	full := &corev1.Node{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: "n1", ResourceVersion: "7", Labels: map[string]string{"a": "b"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate}}},
		Status: corev1.NodeStatus{
			NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.37.2", OSImage: "x"},
			Images:   []corev1.ContainerImage{{Names: []string{"registry.example/big:1"}, SizeBytes: 1 << 30}},
		},
	}
	b, err := json.Marshal(full)
	if err != nil {
		t.Fatal(err)
	}
	obj, _, err := serializer.NewCodecFactory(coreScheme()).UniversalDeserializer().Decode(b, nil, nil)
	if err != nil {
		t.Fatalf("decode a Node: %v", err)
	}
	n, ok := obj.(*coreNode)
	if !ok {
		t.Fatalf("decoded a Node as %T, want *coreNode", obj)
	}
	if n.Name != "n1" || n.ResourceVersion != "7" || n.Status.NodeInfo.KubeletVersion != "v1.37.2" {
		t.Errorf("decoded %+v, want name n1, resourceVersion 7, kubelet v1.37.2", n)
	}
	if _, err := dropManagedFields(n); err != nil || n.ManagedFields != nil {
		t.Errorf("after dropManagedFields: managedFields %v, err %v", n.ManagedFields, err)
	}
	c := n.DeepCopyObject().(*coreNode)
	c.Labels["a"] = "changed"
	if n.Labels["a"] != "b" {
		t.Error("DeepCopyObject shares the labels map")
	}
	list := &coreNodeList{Items: []coreNode{*n}}
	lc := list.DeepCopyObject().(*coreNodeList)
	lc.Items[0].Labels["a"] = "changed"
	if n.Labels["a"] != "b" {
		t.Error("coreNodeList.DeepCopyObject shares an item's labels map")
	}
}

func TestCoreEventEncodesAsTheCoreAPIEvent(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 12, 3, 20, 0, 0, 0, time.UTC))
	ours := &coreEvent{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "m.", Namespace: EventNamespace},
		InvolvedObject: coreObjectReference{APIVersion: "kubeslot.dev/v1alpha1", Kind: "Machine", Name: "m", UID: "u",
			ResourceVersion: "3"},
		Reason: "RequestSucceeded", Type: eventTypeNormal, Message: "repave Succeeded: done",
		Source:         coreEventSource{Component: "kubeslot-watcher", Host: "n"},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	theirs := &corev1.Event{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Event"},
		ObjectMeta: metav1.ObjectMeta{GenerateName: "m.", Namespace: EventNamespace},
		InvolvedObject: corev1.ObjectReference{APIVersion: "kubeslot.dev/v1alpha1", Kind: "Machine", Name: "m", UID: "u",
			ResourceVersion: "3"},
		Reason: "RequestSucceeded", Type: corev1.EventTypeNormal, Message: "repave Succeeded: done",
		Source:         corev1.EventSource{Component: "kubeslot-watcher", Host: "n"},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	// As the REST client encodes a body: with the scheme's group version and kind.
	ns := serializer.NewCodecFactory(coreScheme()).WithoutConversion()
	info, ok := runtime.SerializerInfoForMediaType(ns.SupportedMediaTypes(), runtime.ContentTypeJSON)
	if !ok {
		t.Fatal("no JSON serializer")
	}
	enc := ns.EncoderForVersion(info.Serializer, coreGroupVersion)
	got, err := runtime.Encode(enc, ours)
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	want, err := json.Marshal(theirs)
	if err != nil {
		t.Fatal(err)
	}
	var g, w map[string]any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatal(err)
	}
	gb, _ := json.Marshal(g)
	wb, _ := json.Marshal(w)
	if string(gb) != string(wb) {
		t.Errorf("the watcher's Event encodes as\n%s\nthe core API's as\n%s", gb, wb)
	}
	if eventTypeWarning != corev1.EventTypeWarning || eventTypeNormal != corev1.EventTypeNormal {
		t.Errorf("event types %q %q, want the core API's", eventTypeNormal, eventTypeWarning)
	}
}
