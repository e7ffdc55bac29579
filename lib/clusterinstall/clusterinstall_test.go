package clusterinstall

// Unit tests of the bookkeeping; the integration tests (integration/cluster/api_test.go) install into a real apiserver.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

func TestEveryManifestKindIsKnown(t *testing.T) {
	crds, access, err := manifests()
	if err != nil {
		t.Fatal(err)
	}
	if len(crds) != 4 || len(access) != 9 {
		t.Errorf("%d CRDs and %d access-control objects, want 4 and 9", len(crds), len(access))
	}
	dc, err := dynamic.NewForConfig(&rest.Config{Host: "https://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range append(crds, access...) {
		if _, err := resourceFor(dc, o); err != nil {
			t.Error(err)
		}
	}
	if p := probeMachine(); p.GetName() != ProbeNode {
		t.Errorf("probe Machine named %q", p.GetName())
	}
}

func TestReport(t *testing.T) {
	r := Report{Changes: []Change{
		{Kind: "CustomResourceDefinition", Name: "machines.kubeslot.dev", Action: Unchanged},
		{Kind: "ClusterRole", Name: "kubeslot:agent", Action: Absent},
	}}
	if r.Changed() {
		t.Error("unchanged and absent count as changes")
	}
	var b strings.Builder
	if err := r.Print(&b); err != nil {
		t.Fatal(err)
	}
	if want := "customresourcedefinition/machines.kubeslot.dev unchanged\nclusterrole/kubeslot:agent absent\n"; b.String() != want {
		t.Errorf("Print:\n%s\nwant:\n%s", b.String(), want)
	}
	for _, a := range []Action{Created, Updated, Deleted} {
		r.Changes[1].Action = a
		if !r.Changed() {
			t.Errorf("%s does not count as a change", a)
		}
	}
}

// fakeServer answers GET and server-side apply of one ClusterRole, and lists of Machines.
type fakeServer struct {
	mu       sync.Mutex
	rv       string // "" while absent
	applyRV  string // resourceVersion after the next apply
	applyCT  string
	manager  string
	machines int
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	obj := func(rv string) {
		_ = json.NewEncoder(w).Encode(map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
			"metadata": map[string]any{"name": "r", "resourceVersion": rv}})
	}
	switch {
	case r.URL.Path == "/apis/rbac.authorization.k8s.io/v1/clusterroles/r" && r.Method == http.MethodGet:
		if f.rv == "" {
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(&metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
				Status: metav1.StatusFailure, Reason: metav1.StatusReasonNotFound, Code: 404})
			return
		}
		obj(f.rv)
	case r.URL.Path == "/apis/rbac.authorization.k8s.io/v1/clusterroles/r" && r.Method == http.MethodPatch:
		f.applyCT, f.manager = r.Header.Get("Content-Type"), r.URL.Query().Get("fieldManager")
		f.rv = f.applyRV
		obj(f.rv)
	case r.URL.Path == "/apis/kubeslot.dev/v1alpha1/machines" || r.URL.Path == "/apis/kubeslot.dev/v1alpha1/machineoperations":
		items := []any{}
		if strings.HasSuffix(r.URL.Path, "/machines") {
			for range f.machines {
				items = append(items, map[string]any{"apiVersion": "kubeslot.dev/v1alpha1", "kind": "Machine", "metadata": map[string]any{"name": "m"}})
			}
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"apiVersion": "kubeslot.dev/v1alpha1", "kind": "List", "metadata": map[string]any{}, "items": items})
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

func TestApplyTellsCreatedUpdatedUnchanged(t *testing.T) {
	f := &fakeServer{}
	srv := httptest.NewServer(f)
	defer srv.Close()
	dc, err := dynamic.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	role := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
		"metadata": map[string]any{"name": "r"}}}
	for _, step := range []struct {
		applyRV string
		want    Action
	}{{"5", Created}, {"5", Unchanged}, {"6", Updated}} {
		f.applyRV = step.applyRV
		c, err := apply(context.Background(), dc, role)
		if err != nil {
			t.Fatal(err)
		}
		if c.Action != step.want || c.Kind != "ClusterRole" || c.Name != "r" {
			t.Errorf("apply (resourceVersion -> %s): %+v, want %s", step.applyRV, c, step.want)
		}
	}
	if f.applyCT != "application/apply-patch+yaml" || f.manager != FieldManager {
		t.Errorf("apply sent content type %q, field manager %q; want server-side apply as %q", f.applyCT, f.manager, FieldManager)
	}
}

func TestUninstallRefusesWhileObjectsExist(t *testing.T) {
	f := &fakeServer{machines: 2}
	srv := httptest.NewServer(f)
	defer srv.Close()
	dc, err := dynamic.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	err = refuseIfObjects(context.Background(), dc)
	if !errors.Is(err, ErrObjectsExist) || !strings.Contains(err.Error(), "2 machines") || !strings.Contains(err.Error(), "--delete-objects") {
		t.Errorf("refuseIfObjects = %v, want ErrObjectsExist naming 2 machines and --delete-objects", err)
	}
	f.machines = 0
	if err := refuseIfObjects(context.Background(), dc); err != nil {
		t.Errorf("no objects: %v", err)
	}
}
