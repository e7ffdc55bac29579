package kubelet

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

// shape is what a key of the kubelet configuration takes: the upstream
// type's JSON form, derived from it by reflection (TestSchemaIsUpstreams
// keeps schema.json equal to it).
type shape struct {
	Kind   string            `json:"kind"`
	Fields map[string]*shape `json:"fields,omitempty"` // object
	Elem   *shape            `json:"elem,omitempty"`   // map value, list element
}

// Kinds of shape.
const (
	kindObject   = "object" // a struct: only its fields
	kindMap      = "map"    // string keys, values of Elem
	kindList     = "list"
	kindString   = "string"
	kindBool     = "bool"
	kindInt32    = "int32"
	kindInt64    = "int64"
	kindUint32   = "uint32"
	kindFloat    = "float"
	kindDuration = "duration"          // metav1.Duration: "30s"
	kindDurOrNum = "duration-or-count" // a duration string, or nanoseconds
	kindQuantity = "quantity"          // resource.Quantity: "100Mi"
	kindTime     = "time"              // metav1.Time: RFC 3339
)

//go:embed schema.json
var schemaJSON []byte

// schema is KubeletConfiguration's shape.
var schema = func() *shape {
	var s shape
	if err := json.Unmarshal(schemaJSON, &s); err != nil {
		panic(fmt.Sprintf("kubelet schema.json: %v", err)) // embedded and tested: a build error
	}
	return &s
}()

// check reports the first thing wrong in v at key: a key the shape does not
// have, or a value of another kind. nil is accepted anywhere (JSON null
// decodes into any field as its zero value).
func (s *shape) check(key []string, v any) *Problem {
	if v == nil {
		return nil
	}
	bad := func(want string) *Problem {
		return &Problem{Key: key, Value: clip(valueJSON(v)), Msg: "wrong type: want " + want}
	}
	switch s.Kind {
	case kindObject, kindMap:
		m, ok := v.(map[string]any)
		if !ok {
			return bad("a table (object)")
		}
		for _, k := range sortedKeys(m) {
			f := s.Elem
			if s.Kind == kindObject {
				if f = s.Fields[k]; f == nil {
					return unknownKey(append(slices.Clip(key), k), s)
				}
			}
			if p := f.check(append(slices.Clip(key), k), m[k]); p != nil {
				return p
			}
		}
	case kindList:
		l, ok := v.([]any)
		if !ok {
			return bad("an array")
		}
		for i, e := range l {
			if p := s.Elem.check(append(slices.Clip(key), fmt.Sprint(i)), e); p != nil {
				return p
			}
		}
	case kindString:
		if _, ok := v.(string); !ok {
			return bad("a string")
		}
	case kindBool:
		if _, ok := v.(bool); !ok {
			return bad("true or false")
		}
	case kindInt32, kindInt64, kindUint32:
		lo, hi := float64(math.MinInt32), float64(math.MaxInt32)
		switch s.Kind {
		case kindInt64:
			lo, hi = math.MinInt64, math.MaxInt64
		case kindUint32:
			lo, hi = 0, math.MaxUint32
		}
		f, ok := number(v)
		if !ok || f != math.Trunc(f) || f < lo || f > hi {
			return bad(fmt.Sprintf("an integer from %.0f to %.0f", lo, hi))
		}
	case kindFloat:
		if _, ok := number(v); !ok {
			return bad("a number")
		}
	case kindDuration, kindDurOrNum:
		if _, ok := number(v); ok && s.Kind == kindDurOrNum {
			return nil
		}
		str, ok := v.(string)
		if !ok {
			return bad(`a duration string such as "30s"`)
		}
		if _, err := time.ParseDuration(str); err != nil {
			return bad(`a duration string such as "30s"`)
		}
	case kindQuantity:
		str, ok := v.(string)
		if _, err := resource.ParseQuantity(str); !ok || err != nil {
			return bad(`a quantity string such as "100Mi" or "500m"`)
		}
	case kindTime:
		str, ok := v.(string)
		if _, err := time.Parse(time.RFC3339, str); !ok || err != nil {
			return bad("an RFC 3339 time")
		}
	default:
		return &Problem{Key: key, Msg: "kubelet schema: unknown kind " + s.Kind}
	}
	return nil
}

// unknownKey names a key an object does not have, and a field whose name
// differs only in case: the names are case-sensitive.
func unknownKey(key []string, s *shape) *Problem {
	msg := "unknown key of the kubelet configuration (" + APIVersion + " " + Kind + ")"
	k := key[len(key)-1]
	names := make([]string, 0, len(s.Fields))
	for n := range s.Fields {
		names = append(names, n)
	}
	slices.Sort(names)
	if i := slices.IndexFunc(names, func(n string) bool { return strings.EqualFold(n, k) }); i >= 0 {
		msg += fmt.Sprintf("; did you mean %s? (keys are case-sensitive)", names[i])
	}
	return &Problem{Key: key, Msg: msg}
}

// number is v as a float64 when it is a number as TOML or JSON decodes it.
func number(v any) (float64, bool) {
	switch n := v.(type) {
	case int64:
		return float64(n), true
	case int:
		return float64(n), true
	case float64:
		return n, true
	case json.Number:
		f, err := n.Float64()
		return f, err == nil
	}
	return 0, false
}
