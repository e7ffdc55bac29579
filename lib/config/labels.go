package config

import "strings"

// The kubelet's own label rules (k8s.io/kubelet/pkg/apis, 1.37): in the
// kubernetes.io and k8s.io namespaces it sets only these labels itself and
// refuses to start with any other in --node-labels.
var (
	KubeletLabels = []string{
		"beta.kubernetes.io/arch", "beta.kubernetes.io/instance-type", "beta.kubernetes.io/os",
		"failure-domain.beta.kubernetes.io/region", "failure-domain.beta.kubernetes.io/zone",
		"kubernetes.io/arch", "kubernetes.io/hostname", "kubernetes.io/os",
		"node.kubernetes.io/instance-type", "topology.kubernetes.io/region", "topology.kubernetes.io/zone",
	}
	KubeletLabelNamespaces = []string{"kubelet.kubernetes.io", "node.kubernetes.io"}
)

// KubeletMaySetLabel reports whether the kubelet accepts key in
// --node-labels.
func KubeletMaySetLabel(key string) bool {
	ns, _, found := strings.Cut(key, "/")
	if !found {
		return true
	}
	inNS := func(ns, parent string) bool { return ns == parent || strings.HasSuffix(ns, "."+parent) }
	if !inNS(ns, "kubernetes.io") && !inNS(ns, "k8s.io") {
		return true
	}
	for _, l := range KubeletLabels {
		if key == l {
			return true
		}
	}
	for _, allowed := range KubeletLabelNamespaces {
		if inNS(ns, allowed) {
			return true
		}
	}
	return false
}
