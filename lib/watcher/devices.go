package watcher

import (
	"strings"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/config"
)

// desiredDevices lays a Machine's spec.node.devices over the host's
// [node.devices]: present, its GPUs and paths replace the host's (the
// fingerprint then differs and the host repaves); where the host keeps its
// NVIDIA driver files stays the host's, as the spec cannot know it.
func desiredDevices(dst *config.Devices, spec *v1alpha1.Devices) {
	if spec == nil {
		return
	}
	// The API spells the kinds None and NVIDIA; the configuration none and nvidia.
	dst.GPUs = strings.ToLower(string(spec.GPUs))
	dst.Paths = nil // a fresh slice: the applied configuration is not ours to change
	for _, p := range spec.Paths {
		dst.Paths = append(dst.Paths, string(p))
	}
}
