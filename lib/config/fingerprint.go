package config

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
)

// Canonical returns the canonical form of the configuration: compact JSON
// of a copy with defaults applied and secrets removed. Field order is the
// struct's, map keys are sorted, and optional fields are omitted when
// empty, so key order, comments and whitespace in the file, and spelling
// a default out, make no difference. Arrays keep their order. Paths are
// taken as written: the contents of ca_file or kubeconfig are not read.
func (c *Config) Canonical() ([]byte, error) {
	cp := c.clone()
	cp.ApplyDefaults()
	// Secrets are left out so that rotating the join token does not make
	// an installed node look reconfigured. Every Secret field must be
	// cleared here; TestCanonicalClearsEverySecret checks it by reflection.
	cp.Cluster.BootstrapToken = ""
	// What the mirror gave for the version is a consequence of the
	// settings, not one of them.
	cp.Artifacts.KubeletPinned = nil
	b, err := json.Marshal(cp)
	if err != nil {
		return nil, fmt.Errorf("canonical config: %w", err)
	}
	return b, nil
}

// Fingerprint is the hex sha256 of Canonical: equal for configurations that
// install the same thing, different when any non-secret setting differs.
func (c *Config) Fingerprint() string {
	b, err := c.Canonical()
	if err != nil {
		// Every field type marshals without error (no channels, funcs or
		// failing marshalers), so this is a programming error.
		panic(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// clone deep-copies c, so that defaults applied to the copy do not reach
// the original through shared pointers, slices or maps.
func (c *Config) clone() *Config {
	cp := *c
	cp.Kubernetes.Labels = maps.Clone(c.Kubernetes.Labels)
	cp.Kubernetes.Taints = slices.Clone(c.Kubernetes.Taints)
	cp.Kubernetes.ClusterDNS = slices.Clone(c.Kubernetes.ClusterDNS)
	cp.Kubernetes.Release.KubeletSHA256 = maps.Clone(c.Kubernetes.Release.KubeletSHA256)
	cp.Isolation.Slots = slices.Clone(c.Isolation.Slots)
	cp.Node.Kubelet.Config = maps.Clone(c.Node.Kubelet.Config)
	for _, a := range []**Artifact{&cp.Artifacts.KubeletPinned, &cp.Artifacts.Containerd, &cp.Artifacts.Runc, &cp.Artifacts.CNIPlugins} {
		if *a != nil {
			v := **a
			*a = &v
		}
	}
	return &cp
}
