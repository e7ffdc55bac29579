package clusterinstall

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// deployDir is the repository's kustomize base, from this package's directory.
const deployDir = "../../deploy"

const regenerate = "run `make manifests` (kubeslot cluster manifests --kustomize deploy) and commit deploy/"

func kinds(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetKind()+"/"+o.GetName())
	}
	return out
}

// The printed stream holds exactly the objects Install applies, in its order, and is the same on every call.
func TestWriteYAMLIsWhatInstallApplies(t *testing.T) {
	crds, access, err := manifests()
	if err != nil {
		t.Fatal(err)
	}
	want := append(crds, access...)
	var a, b bytes.Buffer
	if err := WriteYAML(&a); err != nil {
		t.Fatal(err)
	}
	if err := WriteYAML(&b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("two calls of WriteYAML differ")
	}
	if !strings.Contains(a.String(), "Kubernetes "+MinKubernetesVersion+" or later") {
		t.Errorf("the stream does not state the minimum version:\n%.300s", a.String())
	}
	got, err := v1alpha1.DecodeManifests("stream", a.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if g, w := kinds(got), kinds(want); !slices.Equal(g, w) {
		t.Fatalf("printed %q\nInstall applies %q", g, w)
	}
	if n := strings.Count(a.String(), "\n---\n"); n != len(want) {
		t.Errorf("%d document separators for %d objects", n, len(want))
	}
	for i := range got {
		if !reflect.DeepEqual(got[i].Object, want[i].Object) {
			t.Errorf("%s %s: printed object differs from the one Install applies", want[i].GetKind(), want[i].GetName())
		}
	}
}

// deploy/ is exactly what KustomizeBase generates: same files, same bytes, nothing else.
func TestDeployUpToDate(t *testing.T) {
	files, err := KustomizeBase()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, f := range files {
		want[f.Name] = true
		got, err := os.ReadFile(filepath.Join(deployDir, f.Name))
		if err != nil {
			t.Errorf("deploy/%s: %v; %s", f.Name, err, regenerate)
			continue
		}
		if !bytes.Equal(got, f.Data) {
			t.Errorf("deploy/%s differs from what `kubeslot cluster manifests` generates; %s", f.Name, regenerate)
		}
	}
	ents, err := os.ReadDir(deployDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !want[e.Name()] {
			t.Errorf("deploy/%s is not generated (kustomize would not read it, or it is stale); %s", e.Name(), regenerate)
		}
	}
}

// The base lists every object file, in apply order, and (with a kubectl at hand: the rig's, else one on PATH)
// kubectl's own kustomize builds it into exactly the objects Install applies, in the same order.
func TestKustomizeBase(t *testing.T) {
	files, err := KustomizeBase()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Objects()
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	var k []byte
	for _, f := range files {
		if f.Name == KustomizationFile {
			k = f.Data
			continue
		}
		listed = append(listed, f.Name)
	}
	var resources []string
	for _, line := range strings.Split(string(k), "\n") {
		if name, ok := strings.CutPrefix(line, "- "); ok {
			resources = append(resources, name)
		}
	}
	if !slices.Equal(resources, listed) || len(listed) != len(objs) {
		t.Errorf("kustomization resources %q, files %q, for %d objects", resources, listed, len(objs))
	}

	kubectl := ""
	if dir := os.Getenv("KUBESLOT_KUBE_BIN"); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "kubectl")); err == nil {
			kubectl = filepath.Join(dir, "kubectl")
		}
	}
	if kubectl == "" {
		if kubectl, err = exec.LookPath("kubectl"); err != nil {
			t.Skip("no kubectl to build the base with (scripts/kube-bins.sh kubectl builds one)")
		}
	}
	dir := t.TempDir()
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f.Name), f.Data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(kubectl, "kustomize", dir).Output()
	if err != nil {
		t.Fatalf("%s kustomize: %v", kubectl, err)
	}
	built, err := v1alpha1.DecodeManifests("kubectl kustomize", out)
	if err != nil {
		t.Fatal(err)
	}
	if g, w := kinds(built), kinds(objs); !slices.Equal(g, w) {
		t.Fatalf("kubectl kustomize built %q\nInstall applies %q", g, w)
	}
	for i := range built {
		if !reflect.DeepEqual(built[i].Object, objs[i].Object) {
			t.Errorf("%s %s: kubectl kustomize built a different object", objs[i].GetKind(), objs[i].GetName())
		}
	}
}
