package config

import (
	"github.com/kubeslot/kubeslot/lib/oci/ociref"
	"net/url"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Node configures the node machine beyond the kubelet's flags: its pod
// network, its images and what the kubelet reserves. Every field is
// optional; defaults are applied where the value is used, not stored, so a
// configuration without [node] keeps its fingerprint across releases.
type Node struct {
	CNI CNI `toml:"cni" json:"cni,omitzero"`
	// SandboxImage is the pod sandbox ("pause") image containerd runs for
	// every pod ("" = DefaultSandboxImage). A host that cannot reach that
	// registry needs a mirror (RegistryMirrors) or its own image here.
	SandboxImage string `toml:"sandbox_image" json:"sandbox_image,omitempty"`
	// RegistryMirrors maps a registry host ("docker.io", "registry.k8s.io",
	// "registry.example:5000") to mirror URLs, tried in order before the
	// registry itself (containerd's hosts.toml).
	RegistryMirrors map[string][]string `toml:"registry_mirrors" json:"registry_mirrors,omitempty"`
	// KubeReserved and SystemReserved are the kubelet's reservations
	// (resource name → quantity: cpu, memory, ephemeral-storage, pid),
	// subtracted from the node's allocatable.
	KubeReserved   map[string]string `toml:"kube_reserved" json:"kube_reserved,omitempty"`
	SystemReserved map[string]string `toml:"system_reserved" json:"system_reserved,omitempty"`
	// PreloadImages are imported into the node's containerd before the
	// kubelet starts, for hosts without registry access (the sandbox image
	// among them). Each is verified by its sha256, kept in the artifact
	// cache and imported again on each start of a new slot.
	PreloadImages []PreloadImage `toml:"preload_images" json:"preload_images,omitempty"`
	// Devices are host devices passed into the node (GPUs, device nodes).
	Devices Devices `toml:"devices" json:"devices,omitzero"`
	// Kubelet is the user's override of the kubelet's configuration.
	Kubelet Kubelet `toml:"kubelet" json:"kubelet,omitzero"`
}

// PreloadImage is one image to import into the node's containerd.
type PreloadImage struct {
	// Source is an image archive (what `ctr images import` reads: `docker
	// save` or an OCI layout tarball) as an http(s) URL or an absolute
	// path, or an image "oci://<registry>/<repository>:<tag>".
	Source string `toml:"source" json:"source"`
	// SHA256 is the archive's sha256, or for an oci:// image its manifest
	// (or index) digest.
	SHA256 string `toml:"sha256" json:"sha256"`
}

// CNI chooses how pods get their network.
type CNI struct {
	// Mode is one of CNIModes; "" means CNICluster.
	Mode string `toml:"mode" json:"mode,omitempty"`
}

// CNI modes.
const (
	// CNICluster: the cluster's CNI DaemonSet writes the network config
	// and plugins; kubeslot keeps both directories on the host, so they
	// survive a repave or restart.
	CNICluster = "cluster"
	// CNIBridge: kubeslot writes a bridge network for the Node's podCIDR
	// (single-node and edge clusters without a CNI DaemonSet).
	CNIBridge = "bridge"
)

// CNIModes lists the accepted [node.cni] modes.
var CNIModes = []string{CNICluster, CNIBridge}

// DefaultSandboxImage is the sandbox image of Kubernetes 1.37.
const DefaultSandboxImage = "registry.k8s.io/pause:3.10.1"

// CNIMode is Mode with the default applied.
func (c CNI) CNIMode() string {
	if c.Mode == "" {
		return CNICluster
	}
	return c.Mode
}

// Sandbox is SandboxImage with the default applied.
func (n Node) Sandbox() string {
	if n.SandboxImage == "" {
		return DefaultSandboxImage
	}
	return n.SandboxImage
}

// reservable are the resources the kubelet accepts in kubeReserved and
// systemReserved.
var reservable = []string{"cpu", "memory", "ephemeral-storage", "pid"}

func (v *validator) node(n *Node) {
	v.devices(&n.Devices)
	v.kubelet(&n.Kubelet)
	if n.CNI.Mode != "" && !slices.Contains(CNIModes, n.CNI.Mode) {
		v.fail([]string{"node", "cni", "mode"}, quote(n.CNI.Mode), "must be one of %s", quoteList(CNIModes))
	}
	if n.SandboxImage != "" {
		if _, err := name.ParseReference(n.SandboxImage, name.StrictValidation); err != nil {
			v.fail([]string{"node", "sandbox_image"}, quote(n.SandboxImage),
				"must be a full image reference with registry, repository and tag or digest, e.g. %q: %v", DefaultSandboxImage, err)
		}
	}
	for _, host := range SortedKeys(n.RegistryMirrors) {
		p := []string{"node", "registry_mirrors", host}
		if _, err := name.NewRegistry(host, name.StrictValidation); err != nil || strings.ContainsAny(host, "/@") {
			v.fail(p, quote(host), "must be a registry host[:port], e.g. \"docker.io\"")
			continue
		}
		if len(n.RegistryMirrors[host]) == 0 {
			v.fail(p, "[]", "must list at least one mirror URL")
		}
		for i, m := range n.RegistryMirrors[host] {
			u, err := url.Parse(m)
			if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
				v.fail(elem(p, i), quote(safeURL(m)), "must be an http(s) URL of a registry mirror, without credentials or query")
			}
		}
	}
	for i, im := range n.PreloadImages {
		p := elem([]string{"node", "preload_images"}, i)
		v.required(append(p, "sha256"), im.SHA256, v.sha256)
		v.required(append(p, "source"), im.Source, func(p []string, s string) {
			if !ociref.Is(s) {
				v.sourceWithHelp(p, s, sourceHelp+", or an OCI image \"oci://<registry>/<repository>:<tag>\"")
				return
			}
			sha := im.SHA256
			if !sha256RE.MatchString(sha) {
				sha = "" // reported on sha256; check the form only
			}
			if ref, err := ociref.Parse(s, sha); err != nil {
				v.fail(p, safeURL(s), "%v", err)
			} else if ref.Tag == "" {
				v.fail(p, safeURL(s), "needs a tag: pods name an image by it, e.g. \"oci://registry.example/apps/web:v1\"")
			}
		})
	}
	for _, r := range []struct {
		key string
		m   map[string]string
	}{{"kube_reserved", n.KubeReserved}, {"system_reserved", n.SystemReserved}} {
		for _, k := range SortedKeys(r.m) {
			p := []string{"node", r.key, k}
			if !slices.Contains(reservable, k) {
				v.fail(p, quote(k), "must be one of %s", quoteList(reservable))
				continue
			}
			q, err := resource.ParseQuantity(r.m[k])
			if err != nil || q.Sign() < 0 {
				v.fail(p, quote(r.m[k]), "must be a non-negative Kubernetes quantity, e.g. \"500m\" for cpu or \"1Gi\" for memory")
			}
		}
	}
}

// SortedKeys returns the keys of m in order.
func SortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
