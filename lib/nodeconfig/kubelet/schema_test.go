package kubelet

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"

	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
)

// upstream is the reference type's shape, derived now.
func upstream(t *testing.T) *shape {
	t.Helper()
	s, err := derive(reflect.TypeFor[kubeletv1beta1.KubeletConfiguration]())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSchemaIsUpstreams: schema.json is the shape of the KubeletConfiguration
// of the k8s.io/kubelet in go.mod. After a bump of the k8s.io modules,
// KUBESLOT_UPDATE_SCHEMA=1 go test ./lib/nodeconfig/kubelet writes it anew.
func TestSchemaIsUpstreams(t *testing.T) {
	want, err := json.MarshalIndent(upstream(t), "", " ")
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, '\n')
	if os.Getenv("KUBESLOT_UPDATE_SCHEMA") != "" {
		if err := os.WriteFile("schema.json", want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if string(schemaJSON) != string(want) {
		t.Error("schema.json is not the shape of k8s.io/kubelet's KubeletConfiguration: run KUBESLOT_UPDATE_SCHEMA=1 go test ./lib/nodeconfig/kubelet")
	}
}

// TestConfigIsUpstreams: every field of Config is a field of the upstream
// type of the same shape (a duration or quantity written as a string).
func TestConfigIsUpstreams(t *testing.T) {
	local, err := derive(reflect.TypeFor[Config]())
	if err != nil {
		t.Fatal(err)
	}
	var walk func(path string, l, u *shape)
	walk = func(path string, l, u *shape) {
		switch {
		case u == nil:
			t.Errorf("%s: the upstream type has no such key", path)
		case l.Kind == kindString && (u.Kind == kindDuration || u.Kind == kindQuantity):
		case l.Kind != u.Kind:
			t.Errorf("%s: %s here, %s upstream", path, l.Kind, u.Kind)
		case l.Kind == kindObject:
			for k, f := range l.Fields {
				walk(path+"."+k, f, u.Fields[k])
			}
		case l.Elem != nil:
			walk(path+"[]", l.Elem, u.Elem)
		}
	}
	walk("", local, upstream(t))
}

// derive is t's JSON shape, as encoding/json reads it.
func derive(t reflect.Type) (*shape, error) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.PkgPath() + "." + t.Name() {
	case "k8s.io/apimachinery/pkg/apis/meta/v1.Duration":
		return &shape{Kind: kindDuration}, nil
	case "k8s.io/apimachinery/pkg/apis/meta/v1.Time":
		return &shape{Kind: kindTime}, nil
	case "k8s.io/apimachinery/pkg/api/resource.Quantity", "k8s.io/apimachinery/pkg/api/resource.QuantityValue":
		return &shape{Kind: kindQuantity}, nil
	case "k8s.io/component-base/logs/api/v1.TimeOrMetaDuration":
		return &shape{Kind: kindDurOrNum}, nil
	}
	if reflect.PointerTo(t).Implements(reflect.TypeFor[json.Unmarshaler]()) {
		return nil, &unknownType{t}
	}
	switch t.Kind() {
	case reflect.Struct:
		s := &shape{Kind: kindObject, Fields: map[string]*shape{}}
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" || !f.IsExported() {
				continue
			}
			fs, err := derive(f.Type)
			if err != nil {
				return nil, err
			}
			if f.Anonymous && name == "" {
				for k, v := range fs.Fields {
					s.Fields[k] = v
				}
				continue
			}
			if name == "" {
				name = f.Name
			}
			s.Fields[name] = fs
		}
		return s, nil
	case reflect.Map, reflect.Slice:
		e, err := derive(t.Elem())
		if err != nil {
			return nil, err
		}
		if t.Kind() == reflect.Map {
			return &shape{Kind: kindMap, Elem: e}, nil
		}
		return &shape{Kind: kindList, Elem: e}, nil
	case reflect.String:
		return &shape{Kind: kindString}, nil
	case reflect.Bool:
		return &shape{Kind: kindBool}, nil
	case reflect.Int32:
		return &shape{Kind: kindInt32}, nil
	case reflect.Int64:
		return &shape{Kind: kindInt64}, nil
	case reflect.Uint32:
		return &shape{Kind: kindUint32}, nil
	case reflect.Float64, reflect.Float32:
		return &shape{Kind: kindFloat}, nil
	}
	return nil, &unknownType{t}
}

type unknownType struct{ t reflect.Type }

func (e *unknownType) Error() string {
	return "kubelet schema: no shape for " + e.t.PkgPath() + "." + e.t.Name() + " (" + e.t.Kind().String() + ")"
}
