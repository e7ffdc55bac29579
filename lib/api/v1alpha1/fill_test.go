package v1alpha1

import (
	"fmt"
	"reflect"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// fill sets every exported field reachable from v (a pointer) to a non-zero
// value derived from seed, writing through existing pointers, slices and maps
// instead of replacing them, so that filling a deep copy with another seed
// shows any storage it shares with the original. ObjectMeta gets a name only
// (the CRD schemas do not describe metadata).
func fill(v any, seed int) {
	fillValue(reflect.ValueOf(v).Elem(), seed, "")
}

var timeType = reflect.TypeOf(metav1.Time{})

func fillValue(v reflect.Value, seed int, path string) {
	switch {
	case v.Type() == timeType:
		v.Set(reflect.ValueOf(metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5+seed, 0, time.UTC))))
		return
	case v.Type() == reflect.TypeOf(metav1.ObjectMeta{}):
		v.Set(reflect.ValueOf(metav1.ObjectMeta{Name: fmt.Sprintf("name-%d", seed)}))
		return
	case v.Type() == reflect.TypeOf(metav1.TypeMeta{}):
		return
	case v.Type() == reflect.TypeOf(runtime.RawExtension{}):
		// A JSON object of one length for every seed, written through the
		// existing bytes.
		b := reflect.ValueOf([]byte(fmt.Sprintf(`{"seed":"%04d"}`, seed)))
		if raw := v.FieldByName("Raw"); raw.Len() == b.Len() {
			reflect.Copy(raw, b)
		} else {
			raw.Set(b)
		}
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("%s-%d", path, seed))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int32, reflect.Int64:
		v.SetInt(int64(seed))
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		fillValue(v.Elem(), seed, path)
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			f := v.Type().Field(i)
			if !f.IsExported() {
				continue
			}
			fillValue(v.Field(i), seed, path+"."+f.Name)
		}
	case reflect.Slice:
		if v.Len() == 0 {
			v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		}
		for i := 0; i < v.Len(); i++ {
			fillValue(v.Index(i), seed, path)
		}
	case reflect.Map:
		if v.IsNil() {
			v.Set(reflect.MakeMap(v.Type()))
		}
		key := reflect.New(v.Type().Key()).Elem()
		key.SetString("key") // the same key each seed: a shared map shows the new value
		val := reflect.New(v.Type().Elem()).Elem()
		fillValue(val, seed, path)
		v.SetMapIndex(key, val)
	default:
		panic(fmt.Sprintf("fill: %s: unhandled kind %s", path, v.Kind()))
	}
}
