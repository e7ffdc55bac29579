package kuberelease

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/version"

	"github.com/kubeslot/kubeslot/lib/config"
)

// InPlace says whether the node configuration to differs from from only
// by a patch release of Kubernetes: the same major and minor version, and
// nothing else changed but the version and where its kubelet comes from
// (artifacts.kubelet, the release mirror's pin, the per-version digests).
// The version skew policy lets a kubelet move between patch releases of a
// minor with its pods in place, so such a change needs no new slot: the
// kubelet is replaced in the running node and restarted, and the
// containers keep running. why says which it is, for people.
func InPlace(from, to *config.Config) (ok bool, why string) {
	fv, err := version.ParseGeneric(from.Kubernetes.Version)
	if err != nil {
		return false, fmt.Sprintf("the running version %q does not parse", from.Kubernetes.Version)
	}
	tv, err := version.ParseGeneric(to.Kubernetes.Version)
	if err != nil {
		return false, fmt.Sprintf("the desired version %q does not parse", to.Kubernetes.Version)
	}
	step := fmt.Sprintf("kubernetes %s -> %s", from.Kubernetes.Version, to.Kubernetes.Version)
	switch {
	case fv.Major() != tv.Major() || fv.Minor() != tv.Minor():
		return false, step + " changes the minor version"
	case fv.Patch() == tv.Patch():
		return false, "the Kubernetes version is unchanged"
	}
	// The rest of the configuration, with the kubelet's source taken from
	// the running one, must be what runs.
	same := *to
	same.Kubernetes.Version = from.Kubernetes.Version
	same.Kubernetes.Release.KubeletSHA256 = from.Kubernetes.Release.KubeletSHA256
	same.Artifacts.Kubelet, same.Artifacts.KubeletPinned = from.Artifacts.Kubelet, from.Artifacts.KubeletPinned
	if same.Fingerprint() != from.Fingerprint() {
		return false, step + " comes with other changes to the node"
	}
	return true, step + " is a patch release"
}
