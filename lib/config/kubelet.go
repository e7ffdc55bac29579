package config

import (
	"github.com/kubeslot/kubeslot/lib/nodeconfig/kubelet"
)

// Kubelet is the user's layer over kubeslot's kubelet configuration.
type Kubelet struct {
	// Config holds keys of the kubelet's configuration file
	// (KubeletConfiguration, kubelet.config.k8s.io/v1beta1) by their names
	// there (maxPods, evictionHard, featureGates, shutdownGracePeriod, ...),
	// each replacing kubeslot's value of that key. The keys kubeslot owns
	// (lib/nodeconfig/kubelet.Owned) are refused, and so are keys and types
	// the file's type does not have. A Machine's spec.node.kubelet.config
	// replaces the whole table.
	Config map[string]any `toml:"config" json:"config,omitempty"`
}

func (v *validator) kubelet(k *Kubelet) {
	for _, p := range kubelet.Check(k.Config) {
		v.fail(append([]string{"node", "kubelet", "config"}, p.Key...), p.Value, "%s", p.Msg)
	}
}
