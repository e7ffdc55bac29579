package servingcsr

import (
	"bufio"
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
)

// manifestsYAML deploys Watch: a Deployment and the ServiceAccount, roles
// and bindings it needs, nothing more. Embedded so that the binary alone
// can print it.
//
//go:embed manifests.yaml
var manifestsYAML []byte

// ImagePlaceholder is the Deployment's image in manifests.yaml until the
// operator's image replaces it.
const ImagePlaceholder = "KUBESLOT_IMAGE"

// watchArgs are the Deployment's container args before the operator's
// flags.
const watchArgs = `args: ["cluster", "approve-serving", "--watch"]`

// ManifestsYAML returns manifests.yaml with image as the approver's image
// and flags (e.g. --node-cidrs=10.0.0.0/8) appended to its command line,
// ready for kubectl apply. It checks the result decodes (Manifests).
func ManifestsYAML(image string, flags []string) ([]byte, error) {
	if image == "" || strings.ContainsAny(image, " \t\n\"'") {
		return nil, fmt.Errorf("image %q: want an image reference", image)
	}
	for _, f := range flags {
		if !strings.HasPrefix(f, "--") {
			return nil, fmt.Errorf("approver flag %q: want --name=value", f)
		}
	}
	img, err := json.Marshal(image)
	if err != nil {
		return nil, err
	}
	args, err := json.Marshal(append([]string{"cluster", "approve-serving", "--watch"}, flags...))
	if err != nil {
		return nil, err
	}
	if !bytes.Contains(manifestsYAML, []byte(watchArgs)) || !bytes.Contains(manifestsYAML, []byte("image: "+ImagePlaceholder)) {
		return nil, errors.New("embedded manifests.yaml: the image or args line to fill in is missing")
	}
	out := bytes.Replace(manifestsYAML, []byte("image: "+ImagePlaceholder), append([]byte("image: "), img...), 1)
	out = bytes.Replace(out, []byte(watchArgs), append([]byte("args: "), args...), 1)
	if _, err := decodeManifests(out); err != nil {
		return nil, err
	}
	return out, nil
}

// Manifests returns the objects of ManifestsYAML(image, flags), typed
// (a ServiceAccount, RBAC objects, an apps/v1 Deployment), in apply order.
func Manifests(image string, flags []string) ([]runtime.Object, error) {
	data, err := ManifestsYAML(image, flags)
	if err != nil {
		return nil, err
	}
	return decodeManifests(data)
}

func decodeManifests(data []byte) ([]runtime.Object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []runtime.Object
	for i := 1; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("manifests.yaml: document %d: %w", i, err)
		}
		if onlyComments(doc) {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("manifests.yaml: document %d: %w", i, err)
		}
		out = append(out, obj)
	}
	var deploys int
	for _, o := range out {
		if _, ok := o.(*appsv1.Deployment); ok {
			deploys++
		}
	}
	if deploys != 1 {
		return nil, fmt.Errorf("manifests.yaml: %d Deployments, want 1", deploys)
	}
	return out, nil
}

func onlyComments(doc []byte) bool {
	for _, l := range strings.Split(string(doc), "\n") {
		if l = strings.TrimSpace(l); l != "" && l != "---" && !strings.HasPrefix(l, "#") {
			return false
		}
	}
	return true
}
