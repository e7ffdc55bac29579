package config

import "fmt"

// UnpinnedKubeletWarning says, for people checking a file, that the
// kubelet of kubernetes.version comes from a remote release mirror whose
// own digest is all it is checked against; "" when the kubelet is pinned,
// named in artifacts.kubelet, or read from a local path. Not an error: a
// mirror the operator trusts, over https, is a fair choice.
func (c *Config) UnpinnedKubeletWarning() string {
	r := c.Kubernetes.Release
	if c.Artifacts.Kubelet.URL != "" || r.Mirror == "" || r.Mirror[0] == '/' || r.KubeletSHA256[c.Kubernetes.Version] != "" {
		return ""
	}
	return fmt.Sprintf("the kubelet of kubernetes.version %q is checked only against the digest kubernetes.release.mirror %q serves beside it: that catches a corrupted download, not a hostile mirror; pin it with [kubernetes.release.kubelet_sha256] %q = \"<sha256>\"",
		c.Kubernetes.Version, safeURL(r.Mirror), c.Kubernetes.Version)
}
