package machineapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// The operation watch passes on only the operations that target the Machine.
func TestWatchOperationsForFilters(t *testing.T) {
	ops := []v1alpha1.MachineOperation{
		{Spec: v1alpha1.MachineOperationSpec{MachineRef: &v1alpha1.MachineReference{Name: "m1"}}},
		{Spec: v1alpha1.MachineOperationSpec{MachineRef: &v1alpha1.MachineReference{Name: "m2"}}},
		{Spec: v1alpha1.MachineOperationSpec{MachineSelector: &v1alpha1.MachineSelector{MatchLabels: map[string]string{"pool": "a"}}}},
		{Spec: v1alpha1.MachineOperationSpec{MachineSelector: &v1alpha1.MachineSelector{MatchLabels: map[string]string{"pool": "b"}}}},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/apis/kubeslot.dev/v1alpha1/machineoperations" || r.URL.Query().Get("watch") != "true" ||
			r.URL.Query().Get("resourceVersion") != "7" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		for i, op := range ops {
			op.APIVersion, op.Kind = v1alpha1.SchemeGroupVersion.String(), "MachineOperation"
			op.Name = "op" + strconv.Itoa(i)
			raw, _ := json.Marshal(op)
			_ = enc.Encode(map[string]any{"type": "ADDED", "object": json.RawMessage(raw)})
		}
	}))
	defer srv.Close()
	c, err := New(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	m := &v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m1", Labels: map[string]string{"pool": "a", v1alpha1.LabelEnrolled: "true"}}}
	w, err := c.WatchOperationsFor(context.Background(), m, "7")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var got []string
	for ev := range w.ResultChan() {
		if ev.Type != watch.Added {
			t.Fatalf("event %s: %v", ev.Type, ev.Object)
		}
		got = append(got, ev.Object.(*v1alpha1.MachineOperation).Name)
	}
	if strings.Join(got, ",") != "op0,op2" {
		t.Errorf("watch passed %v, want op0 (machineRef) and op2 (selector)", got)
	}
}
