package node

// TestKubeletConfigOnRig: the user's kubelet override layer end to end. A pods host (newPodsRig: the kubelet serves
// its API only with a serving certificate, which it requests for a node address that is not loopback) bootstraps with
// three kubelet keys in config.toml ([node.kubelet] config: maxPods, an evictionHard threshold, a feature gate); the
// kubelet's live configuration, read through the apiserver's node proxy (/configz), has them, and kubeslot's own
// values (the CIS table's) are unchanged. Then the Machine's spec.node.kubelet.config replaces them: the watcher
// repaves onto slot b and the new kubelet runs with the spec's values. Last, a spec that sets a key kubeslot owns
// leaves the node alone and turns the Machine Degraded (InvalidSpec), naming the key.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

func TestKubeletConfigOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()
	p := rig.NewPodsRig(t, ctx, "kcfg", rig.Options{Extra: func(*rig.Rig) string {
		return "\n[node.kubelet]\nconfig = {maxPods = 42, evictionHard = {\"memory.available\" = \"150Mi\"}, " +
			"featureGates = {ContainerCheckpoint = false}}\n"
	}})
	r := p.RepaveRig
	want := map[string]any{"maxPods": 42.0, "evictionHard": map[string]any{"memory.available": "150Mi"},
		"featureGates": map[string]any{"ContainerCheckpoint": false},
		// kubeslot's own, unchanged by the override
		"readOnlyPort": nil, "seccompDefault": true, "podPidsLimit": 4096.0, "eventRecordQPS": 50.0}
	checkConfigz(t, ctx, r.Rig, "config.toml", want)

	// The Machine's spec replaces the host's override whole.
	m := waitMachineOn(t, ctx, r, "a")
	m.Spec.Node.Kubelet = &v1alpha1.Kubelet{Config: &runtime.RawExtension{
		Raw: []byte(`{"maxPods": 43, "evictionHard": {"memory.available": "160Mi"}}`)}}
	m.Spec.UpdatePolicy = v1alpha1.UpdateImmediate
	t0 := time.Now()
	if _, err := r.MC.UpdateMachine(ctx, m); err != nil {
		t.Fatalf("update the Machine spec: %v", err)
	}
	waitMachineOn(t, ctx, r, "b")
	rig.Timing(t, "kubelet config: spec.node.kubelet changed -> Machine reports slot b", time.Since(t0))
	rig.WaitNodeHeartbeat(t, ctx, r.Admin, r.Node, t0, 2*time.Minute, r.H)
	want["maxPods"], want["evictionHard"] = 43.0, map[string]any{"memory.available": "160Mi"}
	delete(want, "featureGates")
	checkConfigz(t, ctx, r.Rig, "spec.node.kubelet", want)

	// An owned key: refused before anything is done, naming the key.
	m = waitMachineOn(t, ctx, r, "b")
	m.Spec.Node.Kubelet.Config.Raw = []byte(`{"maxPods": 44, "readOnlyPort": 10255}`)
	if _, err := r.MC.UpdateMachine(ctx, m); err != nil {
		t.Fatalf("update the Machine spec: %v", err)
	}
	rig.Eventually(t, 2*time.Minute, "the Machine Degraded with InvalidSpec naming readOnlyPort", func() (bool, string) {
		got, err := r.MC.GetMachine(ctx, r.Node)
		if err != nil {
			return false, err.Error()
		}
		for _, c := range got.Status.Conditions {
			if c.Type == v1alpha1.ConditionDegraded && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonInvalidSpec &&
				strings.Contains(c.Message, "spec.node.kubelet.config.readOnlyPort = 10255: kubeslot owns this key") {
				return got.Status.ActiveSlot == "b", fmt.Sprintf("slot %s", got.Status.ActiveSlot)
			}
		}
		return false, fmt.Sprintf("phase %s, conditions %+v", got.Status.Phase, got.Status.Conditions)
	})
}

// checkConfigz reads the kubelet's live configuration through the apiserver's node proxy and compares the keys of
// want (nil: absent or zero, which configz leaves out), within a minute (a new kubelet may not serve yet).
func checkConfigz(t *testing.T, ctx context.Context, r *rig.Rig, what string, want map[string]any) {
	t.Helper()
	rig.Eventually(t, time.Minute, "the kubelet runs with the keys of "+what, func() (bool, string) {
		raw, err := r.Admin.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", r.Node, "proxy", "configz").DoRaw(ctx)
		if err != nil {
			return false, fmt.Sprintf("GET configz: %v %s", err, raw)
		}
		var cz struct {
			KubeletConfig map[string]any `json:"kubeletconfig"`
		}
		if err := json.Unmarshal(raw, &cz); err != nil {
			return false, err.Error()
		}
		var bad []string
		defer func() {
			if len(bad) > 0 {
				time.Sleep(time.Second)
			}
		}()
		for k, v := range want {
			got, ok := cz.KubeletConfig[k]
			if v == nil && (!ok || got == 0.0) {
				continue
			}
			if g, w := jsonString(got), jsonString(v); g != w {
				bad = append(bad, fmt.Sprintf("%s = %s, want %s", k, g, w))
			}
		}
		return len(bad) == 0, strings.Join(bad, "; ")
	})
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// waitMachineOn waits for the Machine the watcher registered to report slot as its active slot, and returns it.
func waitMachineOn(t *testing.T, ctx context.Context, r *rig.RepaveRig, slot string) *v1alpha1.Machine {
	t.Helper()
	var m *v1alpha1.Machine
	rig.Eventually(t, 8*time.Minute, "the Machine reports slot "+slot, func() (bool, string) {
		got, err := r.MC.GetMachine(ctx, r.Node)
		if err != nil {
			return false, err.Error()
		}
		m = got
		if got.Status.ActiveSlot != slot || got.Status.Applied == nil {
			time.Sleep(time.Second)
		}
		return got.Status.ActiveSlot == slot && got.Status.Applied != nil,
			fmt.Sprintf("slot %q phase %s generation %d/%d", got.Status.ActiveSlot, got.Status.Phase, got.Status.ObservedGeneration, got.Generation)
	})
	return m
}

// settingsWithin reports whether every setting of rig (a decoded YAML value) is in ours: the same keys of an object
// with such values, or an equal value.
func settingsWithin(rig, ours any) bool {
	rm, ok := rig.(map[string]any)
	if !ok {
		return fmt.Sprint(rig) == fmt.Sprint(ours)
	}
	om, ok := ours.(map[string]any)
	if !ok {
		return false
	}
	for k, v := range rm {
		if !settingsWithin(v, om[k]) {
			return false
		}
	}
	return true
}
