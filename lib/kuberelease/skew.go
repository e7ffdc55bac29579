package kuberelease

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"
)

// MaxKubeletMinorsBehind is how many minor releases older than
// kube-apiserver the upstream version skew policy lets a kubelet be
// (three since Kubernetes 1.28).
const MaxKubeletMinorsBehind = 3

// SkewPolicy names the rule in messages.
const SkewPolicy = "the Kubernetes version skew policy (a kubelet must not be newer than kube-apiserver, and may be at most 3 minor versions older)"

// CheckSkew refuses a kubelet version the API server's version does not
// allow. Both may carry a leading "v" and a pre-release or build suffix
// (an API server reports e.g. "v1.37.2-eks-1"); the policy compares minor
// versions.
func CheckSkew(kubelet, apiserver string) error {
	k, err := version.ParseGeneric(kubelet)
	if err != nil {
		return fmt.Errorf("kubelet version %q: %w", kubelet, err)
	}
	a, err := version.ParseGeneric(apiserver)
	if err != nil {
		return fmt.Errorf("API server version %q: %w", apiserver, err)
	}
	switch {
	case k.Major() != a.Major():
		return fmt.Errorf("kubernetes version %s: the API server runs %s, another major version; %s", kubelet, apiserver, SkewPolicy)
	case k.Minor() > a.Minor():
		return fmt.Errorf("kubernetes version %s is newer than the API server (%s): %s", kubelet, apiserver, SkewPolicy)
	case a.Minor()-k.Minor() > MaxKubeletMinorsBehind:
		return fmt.Errorf("kubernetes version %s is %d minor versions older than the API server (%s), the oldest allowed is %d.%d: %s",
			kubelet, a.Minor()-k.Minor(), apiserver, a.Major(), a.Minor()-MaxKubeletMinorsBehind, SkewPolicy)
	}
	return nil
}

// ParseKubeletVersion reads `kubelet --version` output ("Kubernetes
// v1.37.2") and returns the version without the "v".
func ParseKubeletVersion(out []byte) (string, error) {
	f := strings.Fields(string(out))
	if len(f) != 2 || f[0] != "Kubernetes" {
		return "", fmt.Errorf("kubelet --version printed %q, want \"Kubernetes v<version>\"", tail(out))
	}
	v, err := version.ParseSemantic(f[1])
	if err != nil {
		return "", fmt.Errorf("kubelet --version printed %q: %w", tail(out), err)
	}
	return strings.TrimPrefix(v.String(), "v"), nil
}

// SameRelease reports whether a reported version (a Node's
// nodeInfo.kubeletVersion, or what a binary printed: "v1.37.2") is the
// release want ("1.37.2"), ignoring a build suffix.
func SameRelease(reported, want string) bool {
	r, err := version.ParseGeneric(reported)
	if err != nil {
		return false
	}
	w, err := version.ParseGeneric(want)
	if err != nil {
		return false
	}
	return r.Major() == w.Major() && r.Minor() == w.Minor() && r.Patch() == w.Patch()
}

func tail(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 120 {
		s = "..." + s[len(s)-117:]
	}
	return s
}
