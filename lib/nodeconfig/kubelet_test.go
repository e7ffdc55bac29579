package nodeconfig

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/yaml"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/kubeslot/kubeslot/lib/nodeconfig/kubelet"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

// userKeys are the keys of kubeslot's base an override may replace: the
// rest are owned (kubelet.Owned), so that a key added to the base is owned
// unless it is added here on purpose.
var userKeys = []string{"failSwapOn", "oomScoreAdj"}

// TestKubeletBaseKeysOwned: every profile's file decodes strictly into the
// upstream KubeletConfiguration, and every key kubeslot sets is owned.
func TestKubeletBaseKeysOwned(t *testing.T) {
	cfg := testConfig(t, testkit.CA(t), "")
	for _, opts := range []Options{{}, {Cgroups: CgroupsNoControllers, RestrictOOMScoreAdj: true}} {
		data := render(t, cfg, opts)[KubeletConfig].Data
		if err := sigsyaml.UnmarshalStrict(data, &kubeletv1beta1.KubeletConfiguration{}); err != nil {
			t.Errorf("%+v: not a KubeletConfiguration: %v\n%s", opts, err, data)
		}
		var kc map[string]any
		if err := yaml.Unmarshal(data, &kc); err != nil {
			t.Fatal(err)
		}
		for k := range kc {
			if !slices.Contains(userKeys, k) && !slices.ContainsFunc(kubelet.Owned, func(o kubelet.OwnedKey) bool { return o.Key == k }) {
				t.Errorf("kubeslot sets %s, which kubelet.Owned does not list (nor userKeys here)", k)
			}
		}
	}
}

// TestKubeletOverride: [node.kubelet] config reaches the file over the
// base, which keeps its values, and the header names the keys.
func TestKubeletOverride(t *testing.T) {
	cfg := testConfig(t, testkit.CA(t), `
[node.kubelet]
config = {maxPods = 42, failSwapOn = true, evictionHard = {"memory.available" = "150Mi"}, shutdownGracePeriod = "20s"}
`)
	data := render(t, cfg, Options{})[KubeletConfig].Data
	if err := sigsyaml.UnmarshalStrict(data, &kubeletv1beta1.KubeletConfiguration{}); err != nil {
		t.Errorf("not a KubeletConfiguration: %v\n%s", err, data)
	}
	var kc map[string]any
	if err := yaml.Unmarshal(data, &kc); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"maxPods": float64(42), "failSwapOn": true, "shutdownGracePeriod": "20s",
		"evictionHard": map[string]any{"memory.available": "150Mi"}, "readOnlyPort": float64(0), "cgroupDriver": "systemd"}
	for k, v := range want {
		if mustJSON(kc[k]) != mustJSON(v) {
			t.Errorf("%s = %s, want %s", k, mustJSON(kc[k]), mustJSON(v))
		}
	}
	if !strings.Contains(string(data), "spec.node.kubelet.config): evictionHard, failSwapOn, maxPods, shutdownGracePeriod.\n") {
		t.Errorf("the header does not name the override's keys:\n%s", data)
	}
}
