package kuberelease

import (
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/config"
)

// Only a patch release with nothing else changed but the kubelet's source
// goes in place; every other change, or none, does not, and why says it.
func TestInPlace(t *testing.T) {
	from := testConfig("https://mirror.example/release")
	from.Kubernetes.Version = "1.37.1"
	from.Artifacts.KubeletPinned = &config.Artifact{URL: "https://mirror.example/release/v1.37.1/kubelet", SHA256: strings.Repeat("a", 64)}
	for _, tc := range []struct {
		name string
		edit func(c *config.Config)
		ok   bool
		why  string
	}{
		{"patch", func(c *config.Config) { c.Kubernetes.Version = "1.37.2" }, true, "kubernetes 1.37.1 -> 1.37.2 is a patch release"},
		{"patch down", func(c *config.Config) { c.Kubernetes.Version = "1.37.0" }, true, "is a patch release"},
		{"patch with its pin and digest", func(c *config.Config) {
			c.Kubernetes.Version = "1.37.2"
			c.Artifacts.KubeletPinned = &config.Artifact{URL: "https://mirror.example/release/v1.37.2/kubelet", SHA256: strings.Repeat("b", 64)}
			c.Kubernetes.Release.KubeletSHA256 = map[string]string{"1.37.2": strings.Repeat("b", 64)}
		}, true, "is a patch release"},
		{"minor", func(c *config.Config) { c.Kubernetes.Version = "1.38.0" }, false, "changes the minor version"},
		{"same", func(c *config.Config) {}, false, "unchanged"},
		{"patch and a label", func(c *config.Config) {
			c.Kubernetes.Version = "1.37.2"
			c.Kubernetes.Labels = map[string]string{"a": "b"}
		}, false, "comes with other changes"},
		{"patch and the rootfs", func(c *config.Config) {
			c.Kubernetes.Version = "1.37.2"
			c.RootFS.SHA256 = strings.Repeat("c", 64)
		}, false, "comes with other changes"},
		{"patch and another mirror", func(c *config.Config) {
			c.Kubernetes.Version = "1.37.2"
			c.Kubernetes.Release.Mirror = "https://other.example/release"
		}, false, "comes with other changes"},
		{"garbage", func(c *config.Config) { c.Kubernetes.Version = "one" }, false, "does not parse"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			to := *from
			to.Kubernetes.Labels = nil
			tc.edit(&to)
			ok, why := InPlace(from, &to)
			if ok != tc.ok || !strings.Contains(why, tc.why) {
				t.Errorf("InPlace = %v, %q; want %v, %q", ok, why, tc.ok, tc.why)
			}
		})
	}
}
