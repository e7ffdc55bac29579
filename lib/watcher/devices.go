package watcher

import (
	"fmt"
	"io/fs"
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

// nvidiaControl is the device node every NVIDIA GPU passed into a node
// needs; a host that allows it allows the spec to ask for its GPUs.
const nvidiaControl = "/dev/nvidiactl"

// checkSpecDevices refuses what spec.node.devices may not reach on this host
// (config.Devices.Refusal): a path the host's allowed list does not match,
// a dangerous node it does not name exactly, or the host's NVIDIA GPUs
// (their device nodes and driver files) unless the host's own
// configuration sets gpus = "nvidia" (hostGPUs) or allows nvidiaControl.
// host is the desired [node.devices], whose Allowed is the applied one's:
// the spec cannot set it. stat looks at the host's node (nil: by name
// alone).
func checkSpecDevices(host config.Devices, hostGPUs string, spec *v1alpha1.Devices, stat config.DeviceStat) error {
	if spec == nil {
		return nil
	}
	if strings.EqualFold(string(spec.GPUs), config.GPUsNVIDIA) && hostGPUs != config.GPUsNVIDIA &&
		host.Refusal(nvidiaControl, nil, true) != "" {
		return fmt.Errorf("spec.node.devices.gpus = %q: this host's node.devices neither sets gpus = %q nor allows %q; "+
			"whether a node may have the host's GPUs is the host's operator's to decide", spec.GPUs, config.GPUsNVIDIA, nvidiaControl)
	}
	for i, p := range spec.Paths {
		if config.CheckDevicePath(string(p)) != "" {
			continue // Validate names the malformed path
		}
		var fi fs.FileInfo
		if stat != nil {
			fi = stat(string(p))
		}
		if msg := host.Refusal(string(p), fi, true); msg != "" {
			return fmt.Errorf("spec.node.devices.paths[%d] = %q: %s", i, p, msg)
		}
	}
	return nil
}
