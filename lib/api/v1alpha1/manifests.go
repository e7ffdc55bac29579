package v1alpha1

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// The CRDs are generated (see generate.go); the access control is written by
// hand. Both are embedded so that `kubeslot cluster install` needs nothing
// but the binary.
var (
	//go:embed crds/*.yaml
	crdFiles embed.FS
	//go:embed access/*.yaml
	accessFiles embed.FS
)

// CRDs returns the CustomResourceDefinitions of this API version, sorted by
// name.
func CRDs() ([]*unstructured.Unstructured, error) { return decodeDir(crdFiles, "crds") }

// AccessControl returns the agents' ClusterRole and ClusterRoleBinding and
// the ValidatingAdmissionPolicies with their bindings, in the order to apply
// them: each policy before its binding, so that a binding never names a
// policy that is not there yet. The policies use Machine as a parameter
// kind, so apply the CRDs first.
func AccessControl() ([]*unstructured.Unstructured, error) {
	return decodeDir(accessFiles, "access")
}

// decodeDir decodes every YAML document of every file in dir, files in name
// order, documents in file order.
func decodeDir(fsys embed.FS, dir string) ([]*unstructured.Unstructured, error) {
	ents, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("embedded manifests %s: %w", dir, err)
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	var out []*unstructured.Unstructured
	for _, n := range names {
		p := path.Join(dir, n)
		data, err := fsys.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("embedded manifest %s: %w", p, err)
		}
		objs, err := DecodeManifests(p, data)
		if err != nil {
			return nil, err
		}
		out = append(out, objs...)
	}
	return out, nil
}

// DecodeManifests decodes a multi-document YAML (or JSON) stream; file names
// it in errors. Empty documents are skipped; every other document must have
// an apiVersion, a kind and a name.
func DecodeManifests(file string, data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for i := 0; ; i++ {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("%s: document %d: %w", file, i+1, err)
		}
		if len(obj) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		if u.GetAPIVersion() == "" || u.GetKind() == "" || u.GetName() == "" {
			return nil, fmt.Errorf("%s: document %d: apiVersion, kind and metadata.name are required", file, i+1)
		}
		out = append(out, u)
	}
}
