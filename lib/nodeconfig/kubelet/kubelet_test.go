package kubelet

import (
	"os"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestOwnedKeysExist: every owned key is a key of the type, so a typo in
// Owned cannot leave the real key open.
func TestOwnedKeysExist(t *testing.T) {
	up := upstream(t)
	for _, o := range Owned {
		top, _, _ := strings.Cut(o.Key, ".")
		if up.Fields[top] == nil {
			t.Errorf("owned key %s: the kubelet configuration has no %s", o.Key, top)
		}
	}
}

func TestCheck(t *testing.T) {
	ok := map[string]any{
		"maxPods":                int64(42),
		"evictionHard":           map[string]any{"memory.available": "150Mi"},
		"shutdownGracePeriod":    "20s",
		"featureGates":           map[string]any{"SomeGate": true},
		"memoryThrottlingFactor": 0.9,
		"logging":                map[string]any{"format": "json", "flushFrequency": float64(5e9), "options": map[string]any{"json": map[string]any{"infoBufferSize": "1Mi"}}},
		"reservedMemory":         []any{map[string]any{"numaNode": int64(0), "limits": map[string]any{"memory": "1Gi"}}},
		"failSwapOn":             nil,
	}
	if ps := Check(ok); len(ps) > 0 {
		t.Errorf("valid override refused: %+v", ps)
	}
	cases := []struct {
		key       string
		v         any
		want, msg string
	}{
		{"readOnlyPort", int64(10255), "readOnlyPort", "kubeslot owns this key"},
		{"authentication", map[string]any{"anonymous": map[string]any{"enabled": true}}, "authentication", "kubeslot owns this key"},
		{"featureGates", map[string]any{"RotateKubeletServerCertificate": false}, "featureGates.RotateKubeletServerCertificate", "kubeslot owns this key"},
		{"clusterDNS", []any{"10.0.0.10"}, "clusterDNS", "kubernetes.cluster_dns"},
		{"maxpods", int64(3), "maxpods", "did you mean maxPods?"},
		{"noSuchKey", true, "noSuchKey", "unknown key"},
		{"maxPods", "many", "maxPods", "wrong type: want an integer"},
		{"maxPods", int64(1) << 40, "maxPods", "an integer from -2147483648 to 2147483647"},
		{"maxPods", 1.5, "maxPods", "an integer"},
		{"shutdownGracePeriod", "soon", "shutdownGracePeriod", "a duration string"},
		{"evictionHard", []any{"x"}, "evictionHard", "a table"},
		{"logging", map[string]any{"formt": "json"}, "logging.formt", "unknown key"},
		{"reservedMemory", []any{map[string]any{"limits": map[string]any{"memory": "lots"}}}, "reservedMemory.0.limits.memory", "a quantity"},
	}
	for _, c := range cases {
		ps := Check(map[string]any{c.key: c.v})
		if len(ps) != 1 || strings.Join(ps[0].Key, ".") != c.want || !strings.Contains(ps[0].Msg, c.msg) {
			t.Errorf("%s = %v: %+v, want one problem at %s saying %q", c.key, c.v, ps, c.want, c.msg)
		}
	}
}

// TestRender: the base's keys, the override's keys replacing the base's as
// written (an empty table stays one); an owned key is refused.
func TestRender(t *testing.T) {
	base := &Config{Port: 10250, FailSwapOn: false}
	out, err := Render(base, map[string]any{"maxPods": int64(42), "failSwapOn": true, "evictionHard": map[string]any{}}, "# header\n")
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := yaml.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]any{"port": float64(10250), "readOnlyPort": float64(0), "maxPods": float64(42), "failSwapOn": true,
		"evictionHard": map[string]any{}} {
		g, _ := yaml.Marshal(got[k])
		w, _ := yaml.Marshal(v)
		if string(g) != string(w) {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if !strings.HasPrefix(string(out), "# header\n") {
		t.Errorf("rendered:\n%s", out)
	}
	if _, err := Render(base, map[string]any{"port": int64(1)}, ""); err == nil || !strings.Contains(err.Error(), "port") {
		t.Errorf("an owned key in the override: %v", err)
	}
}

// TestREADMEListsOwned: README's node section names every owned key.
func TestREADMEListsOwned(t *testing.T) {
	readme, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(readme), "- **Kubelet settings**")
	section, _, _ = strings.Cut(section, "\n- **")
	for _, o := range Owned {
		if !strings.Contains(section, "`"+o.Key+"`") {
			t.Errorf("README's Kubelet settings do not name the owned key %s", o.Key)
		}
	}
}
