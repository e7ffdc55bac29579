package v1alpha1

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	"k8s.io/apimachinery/pkg/runtime"
)

// The deep copies copy everything: a fully filled object equals its copy, and
// refilling the copy with other values leaves the original as it was. A field
// added without regenerating zz_generated.deepcopy.go fails here.
func TestDeepCopyIsCompleteAndDeep(t *testing.T) {
	for _, obj := range []interface {
		runtime.Object
	}{&Machine{}, &MachineList{}, &MachineOperation{}, &MachineOperationList{}} {
		name := reflect.TypeOf(obj).Elem().Name()
		fill(obj, 1)
		cp := obj.DeepCopyObject()
		if !reflect.DeepEqual(obj, cp) {
			t.Errorf("%s: DeepCopy differs from the original", name)
		}
		fill(cp, 2)
		want := reflect.New(reflect.TypeOf(obj).Elem()).Interface()
		fill(want, 1)
		if !reflect.DeepEqual(obj, want) {
			t.Errorf("%s: changing the copy changed the original: storage is shared", name)
		}
	}
}

func loadCRDs(t *testing.T) map[string]*apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	objs, err := CRDs()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*apiextensionsv1.CustomResourceDefinition{}
	for _, u := range objs {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, crd, true); err != nil {
			t.Fatalf("%s: %v", u.GetName(), err)
		}
		out[crd.Spec.Names.Kind] = crd
	}
	return out
}

func structural(t *testing.T, crd *apiextensionsv1.CustomResourceDefinition) *structuralschema.Structural {
	t.Helper()
	var internal apiextensions.JSONSchemaProps
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(crd.Spec.Versions[0].Schema.OpenAPIV3Schema, &internal, nil); err != nil {
		t.Fatal(err)
	}
	s, err := structuralschema.NewStructural(&internal)
	if err != nil {
		t.Fatalf("%s: %v", crd.Name, err)
	}
	if errs := structuralschema.ValidateStructural(nil, s); len(errs) > 0 {
		t.Fatalf("%s: not a structural schema: %v", crd.Name, errs.ToAggregate())
	}
	return s
}

func TestCRDsDescribeTheAPI(t *testing.T) {
	crds := loadCRDs(t)
	for kind, plural := range map[string]string{"Machine": MachinesResource, "MachineOperation": MachineOperationsResource} {
		crd := crds[kind]
		if crd == nil {
			t.Fatalf("no CRD for %s", kind)
		}
		if crd.Name != plural+"."+GroupName || crd.Spec.Group != GroupName || crd.Spec.Names.Plural != plural ||
			crd.Spec.Scope != apiextensionsv1.ClusterScoped {
			t.Errorf("%s: name %s, group %s, plural %s, scope %s", kind, crd.Name, crd.Spec.Group, crd.Spec.Names.Plural, crd.Spec.Scope)
		}
		if len(crd.Spec.Versions) != 1 {
			t.Fatalf("%s: %d versions", kind, len(crd.Spec.Versions))
		}
		// Cluster API's Machine answers to "ma" (and "machines", "machine"): ours must not claim those, or
		// kubectl would pick one of the two for a short name in a cluster that runs both.
		want := map[string]string{"Machine": "ksm", "MachineOperation": "mop"}[kind]
		if got := crd.Spec.Names.ShortNames; !slices.Equal(got, []string{want}) {
			t.Errorf("%s: short names %q, want [%s]", kind, got, want)
		}
		v := crd.Spec.Versions[0]
		if v.Name != SchemeGroupVersion.Version || !v.Served || !v.Storage || v.Subresources == nil || v.Subresources.Status == nil {
			t.Errorf("%s: version %s served=%v storage=%v, status subresource %v", kind, v.Name, v.Served, v.Storage, v.Subresources)
		}
		s := structural(t, crd)
		// printer columns and selectable fields name paths that exist
		var paths []string
		for _, c := range v.AdditionalPrinterColumns {
			paths = append(paths, c.JSONPath)
		}
		for _, f := range v.SelectableFields {
			paths = append(paths, f.JSONPath)
		}
		for _, p := range paths {
			if strings.HasPrefix(p, ".metadata.") {
				continue
			}
			if !schemaHas(s, strings.Split(strings.TrimPrefix(p, "."), ".")) {
				t.Errorf("%s: column or selectable field %s names no field of the schema", kind, p)
			}
		}
	}
}

func schemaHas(s *structuralschema.Structural, path []string) bool {
	for _, p := range path {
		next, ok := s.Properties[p]
		if !ok {
			return false
		}
		s = &next
	}
	return true
}

// Every field of the Go types is in the CRD's schema (pruning drops none of a
// fully filled object), and every field of the schema is in the Go types (the
// filled object's JSON has each one). A type change without regenerating the
// CRDs fails here.
func TestCRDSchemasMatchGoTypes(t *testing.T) {
	crds := loadCRDs(t)
	for kind, obj := range map[string]runtime.Object{"Machine": &Machine{}, "MachineOperation": &MachineOperation{}} {
		s := structural(t, crds[kind])
		fill(obj, 1)
		b, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		doc["apiVersion"], doc["kind"] = SchemeGroupVersion.String(), kind
		pruned := pruning.PruneWithOptions(doc, s, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})
		if len(pruned) > 0 {
			t.Errorf("%s: Go fields missing from the CRD schema: %v", kind, pruned)
		}
		var missing []string
		walkSchema(s, doc, "", &missing)
		if len(missing) > 0 {
			t.Errorf("%s: schema fields missing from the Go types: %v", kind, missing)
		}
	}
}

func walkSchema(s *structuralschema.Structural, v any, path string, missing *[]string) {
	switch x := v.(type) {
	case map[string]any:
		if s.AdditionalProperties != nil && s.AdditionalProperties.Structural != nil {
			for k, e := range x {
				walkSchema(s.AdditionalProperties.Structural, e, path+"["+k+"]", missing)
			}
		}
		for name, prop := range s.Properties {
			if path == "" && name == "metadata" {
				continue
			}
			e, ok := x[name]
			if !ok {
				*missing = append(*missing, path+"."+name)
				continue
			}
			walkSchema(&prop, e, path+"."+name, missing)
		}
	case []any:
		if s.Items != nil {
			for _, e := range x {
				walkSchema(s.Items, e, path+"[]", missing)
			}
		}
	}
	slices.Sort(*missing)
}
