package watcher

// The desired configuration: a Machine's spec.node laid over the applied configuration (Decide compares it with
// what the node runs; the devices are in devices.go).

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/config"
)

// Desired lays the Machine's node configuration over the applied one: the
// Kubernetes version, rootfs, labels and taints come from the spec, and each
// artifact the spec overrides. The result is validated like a bootstrap
// configuration; errors name the spec field and value. stat looks at the
// host's device nodes the spec names (nil: judged by name alone).
func Desired(applied *config.Config, n *v1alpha1.NodeConfig, stat config.DeviceStat) (*config.Config, error) {
	if applied == nil {
		return nil, errors.New("no applied configuration")
	}
	c := clone(applied)
	c.Kubernetes.Version = n.KubernetesVersion
	c.RootFS = config.RootFS{Source: string(n.RootFS.Source), SHA256: string(n.RootFS.SHA256)}
	c.Kubernetes.Labels = nil
	for k, v := range n.Labels {
		if c.Kubernetes.Labels == nil {
			c.Kubernetes.Labels = map[string]string{}
		}
		c.Kubernetes.Labels[k] = string(v)
	}
	c.Kubernetes.Taints = nil
	for _, t := range n.Taints {
		c.Kubernetes.Taints = append(c.Kubernetes.Taints, string(t))
	}
	if n.SandboxImage != "" {
		c.Node.SandboxImage = n.SandboxImage
	}
	desiredDevices(&c.Node.Devices, n.Devices)
	if err := desiredKubelet(&c.Node.Kubelet, n.Kubelet); err != nil {
		return nil, err
	}
	// The repaver looks the kubelet up again for the desired version.
	c.Artifacts.KubeletPinned = nil
	if r := n.KubernetesRelease; r != nil {
		// The host's pins stay: the spec picks the mirror, not which
		// binaries the host's operator accepts for a version.
		pins := maps.Clone(c.Kubernetes.Release.KubeletSHA256)
		if sum := string(r.KubeletSHA256); sum != "" {
			if host, ok := pins[n.KubernetesVersion]; ok && host != sum {
				return nil, fmt.Errorf("spec.node.kubernetesRelease.kubeletSHA256 %q disagrees with the host's kubernetes.release.kubelet_sha256 %q = %q: the kubelet of %s has one digest",
					sum, n.KubernetesVersion, host, n.KubernetesVersion)
			}
			if pins == nil {
				pins = map[string]string{}
			}
			pins[n.KubernetesVersion] = sum
		}
		c.Kubernetes.Release = config.Release{Mirror: string(r.Mirror), CAPEM: r.CAPEM, KubeletSHA256: pins}
		if n.Artifacts == nil || n.Artifacts.Kubelet == nil {
			// The spec picks the mirror: a kubelet file the host's
			// configuration named is not the spec's version's.
			c.Artifacts.Kubelet = config.Artifact{}
		}
	}
	if a := n.Artifacts; a != nil {
		if a.Kubelet != nil {
			c.Artifacts.Kubelet = config.Artifact{URL: string(a.Kubelet.URL), SHA256: string(a.Kubelet.SHA256)}
		}
		for _, o := range []struct {
			src *v1alpha1.Artifact
			dst **config.Artifact
		}{{a.Containerd, &c.Artifacts.Containerd}, {a.Runc, &c.Artifacts.Runc}, {a.CNIPlugins, &c.Artifacts.CNIPlugins}} {
			if o.src != nil {
				*o.dst = &config.Artifact{URL: string(o.src.URL), SHA256: string(o.src.SHA256)}
			}
		}
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("%s", specPaths(err.Error()))
	}
	if err := checkSpecDevices(c.Node.Devices, applied.Node.Devices.GPUs, n.Devices, stat); err != nil {
		return nil, err
	}
	return c, nil
}

// specPaths renames configuration keys to the Machine spec fields they came
// from, so the message names what an admin can change.
func specPaths(s string) string {
	return strings.NewReplacer(
		"kubernetes.version", "spec.node.kubernetesVersion",
		"kubernetes.labels", "spec.node.labels",
		"kubernetes.taints", "spec.node.taints",
		"rootfs.source", "spec.node.rootfs.source",
		"rootfs.sha256", "spec.node.rootfs.sha256",
		"artifacts.", "spec.node.artifacts.",
		"node.sandbox_image", "spec.node.sandboxImage",
		"node.devices.gpus", "spec.node.devices.gpus",
		"node.devices.paths", "spec.node.devices.paths",
		"node.kubelet.config", "spec.node.kubelet.config",
		"kubernetes.release.mirror", "spec.node.kubernetesRelease.mirror",
		"kubernetes.release.ca_pem", "spec.node.kubernetesRelease.caPEM",
		"kubernetes.release.kubelet_sha256", "spec.node.kubernetesRelease.kubeletSHA256",
	).Replace(s)
}

func clone(c *config.Config) *config.Config {
	out := *c
	out.Kubernetes.Labels = maps.Clone(c.Kubernetes.Labels)
	out.Kubernetes.Taints = slices.Clone(c.Kubernetes.Taints)
	out.Kubernetes.ClusterDNS = slices.Clone(c.Kubernetes.ClusterDNS)
	out.Kubernetes.Release.KubeletSHA256 = maps.Clone(c.Kubernetes.Release.KubeletSHA256)
	out.Isolation.Slots = slices.Clone(c.Isolation.Slots)
	out.Node.Kubelet.Config = maps.Clone(c.Node.Kubelet.Config)
	for _, p := range []**config.Artifact{&out.Artifacts.KubeletPinned, &out.Artifacts.Containerd, &out.Artifacts.Runc, &out.Artifacts.CNIPlugins} {
		if *p != nil {
			a := **p
			*p = &a
		}
	}
	return &out
}

// desiredKubelet lays a Machine's spec.node.kubelet over the host's
// [node.kubelet]: absent, the host's stays; present, its config replaces the
// host's whole (none clears it). Config.Validate checks the keys.
func desiredKubelet(dst *config.Kubelet, k *v1alpha1.Kubelet) error {
	if k == nil {
		return nil
	}
	dst.Config = nil
	if k.Config == nil || len(k.Config.Raw) == 0 || string(k.Config.Raw) == "null" {
		return nil
	}
	if err := json.Unmarshal(k.Config.Raw, &dst.Config); err != nil {
		return fmt.Errorf("spec.node.kubelet.config: want an object of kubelet configuration keys: %v", err)
	}
	return nil
}
