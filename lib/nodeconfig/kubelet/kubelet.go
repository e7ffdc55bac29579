// Package kubelet is the kubelet's configuration file as kubeslot writes it:
// the part of the upstream KubeletConfiguration type
// (kubelet.config.k8s.io/v1beta1) kubeslot sets, the keys it owns, and a
// user's override laid over it. lib/nodeconfig fills Config and renders the
// file with Render; lib/config checks an override with Check ([node.kubelet]
// config, and so a Machine's spec.node.kubelet.config, which the watcher
// lays into the desired configuration). Imported by those two only.
//
// The upstream type is the reference, not a dependency at run time: it
// imports k8s.io/api, which the watcher must not link (it links the node
// renderer through the isolation backends). Its shape is derived from it
// into schema.json, and Config's fields are its fields; the tests hold both
// to the type and decode every rendered file strictly into it.
package kubelet

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// APIVersion and Kind of the file.
const (
	APIVersion = "kubelet.config.k8s.io/v1beta1"
	Kind       = "KubeletConfiguration"
)

// OwnedKey is a key of the kubelet configuration that kubeslot sets (or
// keeps unset) itself, and an override may not change.
type OwnedKey struct {
	// Key is the JSON name; a dotted key names one entry of an object
	// (featureGates.X). A top-level key covers everything under it.
	Key string
	// Why says what the key is bound to, for the error message.
	Why string
}

const (
	whyAPI      = "the kubelet API's authentication, authorization and TLS"
	whyCIS      = "a hardened value of README's CIS table"
	whyLayout   = "the node's layout, which kubeslot's units, health checks and CRI client rely on"
	whyCgroups  = "the cgroup profile kubeslot detects on the host, matched by containerd's cgroup driver"
	whyStatic   = "the node runs only pods the apiserver admitted"
	whyIdentity = "the node identity kubeslot keeps across slots"
)

// Owned lists every key an override may not set, in one place: the kubelet
// API's security and README's CIS table, what kubeslot's layout relies on,
// the cgroup profile, and settings of kubeslot's own configuration (which
// name the key to use instead).
var Owned = []OwnedKey{
	{"apiVersion", "the file's type"},
	{"kind", "the file's type"},
	{"enableServer", whyAPI},
	{"address", whyAPI},
	{"port", whyLayout},
	{"readOnlyPort", whyCIS},
	{"authentication", whyAPI},
	{"authorization", whyAPI},
	{"tlsCertFile", whyAPI},
	{"tlsPrivateKeyFile", whyAPI},
	{"tlsCipherSuites", whyCIS},
	{"tlsMinVersion", whyAPI},
	{"tlsCurvePreferences", whyAPI},
	{"serverTLSBootstrap", whyIdentity},
	{"rotateCertificates", whyIdentity},
	{"featureGates.RotateKubeletServerCertificate", whyCIS},
	{"streamingConnectionIdleTimeout", whyCIS},
	{"eventRecordQPS", whyCIS},
	{"podPidsLimit", whyCIS},
	{"seccompDefault", whyCIS},
	{"protectKernelDefaults", whyCIS + "; the node's /proc/sys is read-only"},
	{"makeIPTablesUtilChains", whyCIS + "; the firewall is the host's and the CNI's"},
	{"healthzBindAddress", whyLayout},
	{"healthzPort", whyLayout},
	{"containerRuntimeEndpoint", whyLayout},
	{"imageServiceEndpoint", whyLayout},
	{"registerNode", whyLayout},
	{"staticPodPath", whyStatic},
	{"staticPodURL", whyStatic},
	{"staticPodURLHeader", whyStatic},
	{"cgroupDriver", whyCgroups},
	{"cgroupRoot", whyCgroups},
	{"cgroupsPerQOS", whyCgroups},
	{"enforceNodeAllocatable", whyCgroups},
	{"failCgroupV1", whyCgroups},
	{"kubeletCgroups", whyCgroups},
	{"systemCgroups", whyCgroups},
	{"clusterDNS", "set it with kubernetes.cluster_dns"},
	{"clusterDomain", "set it with kubernetes.cluster_domain"},
	{"registerWithTaints", "set it with kubernetes.taints"},
	{"kubeReserved", "set it with node.kube_reserved"},
	{"systemReserved", "set it with node.system_reserved"},
}

// Problem is one thing wrong in an override: the key path under the
// override, its value as JSON ("" when not useful) and what is wrong.
type Problem struct {
	Key   []string
	Value string
	Msg   string
}

// Check reports what is wrong in override, one problem per top-level key:
// an owned key, a key the kubelet configuration does not have (names are
// case-sensitive), or a value of the wrong type. The values themselves (a
// negative maxPods, an eviction signal the kubelet does not know) are the
// kubelet's to judge when it starts, and a repave's health gate rolls such
// a slot back.
func Check(override map[string]any) []Problem {
	var out []Problem
	for _, k := range sortedKeys(override) {
		v := override[k]
		if p, ok := ownedProblem(k, v); ok {
			out = append(out, p)
			continue
		}
		if p := schema.check(nil, map[string]any{k: v}); p != nil {
			out = append(out, *p)
		}
	}
	return out
}

func ownedProblem(k string, v any) (Problem, bool) {
	for _, o := range Owned {
		top, sub, nested := strings.Cut(o.Key, ".")
		if top != k {
			continue
		}
		key := []string{k}
		if nested {
			m, _ := v.(map[string]any)
			sv, ok := m[sub]
			if !ok {
				continue
			}
			key, v = append(key, sub), sv
		}
		return Problem{key, clip(valueJSON(v)), "kubeslot owns this key (" + o.Why + "); an override may not set it"}, true
	}
	return Problem{}, false
}

// Render writes the kubelet's configuration file: base, then each key of
// override replacing the base's as written, keys sorted, after header
// (comment lines). An override Check refuses is an error.
func Render(base *Config, override map[string]any, header string) ([]byte, error) {
	b, err := json.Marshal(base)
	if err != nil {
		return nil, fmt.Errorf("kubelet configuration: %w", err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("kubelet configuration: %w", err)
	}
	if ps := Check(override); len(ps) > 0 {
		return nil, fmt.Errorf("kubelet configuration override: %s: %s", strings.Join(ps[0].Key, "."), ps[0].Msg)
	}
	for k, v := range override {
		if doc[k], err = json.Marshal(v); err != nil {
			return nil, fmt.Errorf("kubelet configuration override %s: %w", k, err)
		}
	}
	js, err := json.Marshal(doc) // keys sorted
	if err != nil {
		return nil, fmt.Errorf("kubelet configuration: %w", err)
	}
	y, err := yaml.JSONToYAML(js)
	if err != nil {
		return nil, fmt.Errorf("kubelet configuration: %w", err)
	}
	return append([]byte(header), y...), nil
}

func valueJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// clip keeps a value in an error message to one short line.
func clip(s string) string {
	if r := []rune(s); len(r) > 80 {
		return string(r[:80]) + "…"
	}
	return s
}

func sortedKeys(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
