package watcher

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// TestDesiredKubelet: spec.node.kubelet.config replaces the host's
// [node.kubelet] config (so the fingerprint changes and the host repaves,
// as for any spec.node change), absent keeps it, an empty one clears it, and
// an owned or unknown key is refused naming the spec field and the value.
func TestDesiredKubelet(t *testing.T) {
	a := applied(t)
	a.Config.Node.Kubelet.Config = map[string]any{"maxPods": int64(42)}
	m := NewMachine("m1", node, a)
	same, err := Desired(a.Config, &m.Spec.Node, nil)
	if err != nil || same.Fingerprint() != a.Config.Fingerprint() {
		t.Fatalf("no spec kubelet: %v, fingerprint changed %v", err, err == nil && same.Fingerprint() != a.Config.Fingerprint())
	}
	spec := func(js string) *v1alpha1.Kubelet {
		return &v1alpha1.Kubelet{Config: &runtime.RawExtension{Raw: []byte(js)}}
	}
	// The same override written in the spec: the same fingerprint (JSON's float 42 is TOML's integer 42).
	m.Spec.Node.Kubelet = spec(`{"maxPods": 42}`)
	if d, err := Desired(a.Config, &m.Spec.Node, nil); err != nil || d.Fingerprint() != a.Config.Fingerprint() {
		t.Errorf("the host's own override in the spec: %v, fingerprint changed %v", err, err == nil && d.Fingerprint() != a.Config.Fingerprint())
	}
	m.Spec.Node.Kubelet = spec(`{"maxPods": 150, "shutdownGracePeriod": "30s"}`)
	d, err := Desired(a.Config, &m.Spec.Node, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Node.Kubelet.Config; len(got) != 2 || got["maxPods"] != float64(150) || got["shutdownGracePeriod"] != "30s" {
		t.Errorf("desired kubelet config %v", got)
	}
	if d.Fingerprint() == a.Config.Fingerprint() {
		t.Error("spec.node.kubelet leaves the fingerprint: the host would not repave")
	}
	if a.Config.Node.Kubelet.Config["maxPods"] != int64(42) || len(a.Config.Node.Kubelet.Config) != 1 {
		t.Error("Desired changed the applied configuration")
	}
	m.Spec.Node.Kubelet = &v1alpha1.Kubelet{}
	if d, err := Desired(a.Config, &m.Spec.Node, nil); err != nil || d.Node.Kubelet.Config != nil {
		t.Errorf("an empty spec.node.kubelet: %v %v", err, d.Node.Kubelet.Config)
	}
	for js, want := range map[string]string{
		`{"readOnlyPort": 10255}`: "spec.node.kubelet.config.readOnlyPort = 10255: kubeslot owns this key",
		`{"maxpods": 1}`:          "spec.node.kubelet.config.maxpods: unknown key",
		`{"maxPods": "x"}`:        `spec.node.kubelet.config.maxPods = "x": wrong type`,
		`[1]`:                     "spec.node.kubelet.config: want an object",
	} {
		m.Spec.Node.Kubelet = spec(js)
		if _, err := Desired(a.Config, &m.Spec.Node, nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("spec.node.kubelet.config %s: %v, want %q", js, err, want)
		}
	}
}
