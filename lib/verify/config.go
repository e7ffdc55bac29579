package verify

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strings"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/units"
)

// DefaultConfigFile is the configuration the bootstrap unit runs with.
const DefaultConfigFile = units.ConfigPath

// FieldDiff is one setting in which a configuration file differs from the
// applied configuration, by its TOML key (labels and maps by entry).
// Values are canonical JSON, clipped; secrets never appear (the canonical
// form leaves them out).
type FieldDiff struct {
	Field   string
	File    string // the file's value ("(unset)" when it has none)
	Applied string // the applied configuration's value
	// Spec is the Machine spec field that governs this setting after
	// installation ("" for a setting only a reset changes).
	Spec string
}

// machineFields are the settings a Machine's spec.node carries over the
// applied configuration (lib/watcher.Desired): after installation they
// change through the Machine, by a repave. Keyed by TOML key prefix.
var machineFields = []struct{ key, spec string }{
	{"kubernetes.version", "spec.node.kubernetesVersion"},
	{"kubernetes.labels", "spec.node.labels"},
	{"kubernetes.taints", "spec.node.taints"},
	{"kubernetes.release", "spec.node.kubernetesRelease"},
	{"rootfs", "spec.node.rootfs"},
	{"artifacts", "spec.node.artifacts"},
	{"node.sandbox_image", "spec.node.sandboxImage"},
}

// specField is the Machine spec field that governs key, "" if none.
func specField(key string) string {
	for _, m := range machineFields {
		if key == m.key || strings.HasPrefix(key, m.key+".") {
			return m.spec
		}
	}
	return ""
}

// ConfigDiff lists the settings in which file differs from applied, in key
// order. Both are compared in canonical form (defaults applied, secrets and
// the kubelet pin left out), so formatting, comments, a spelled-out default
// or a rotated join token are no difference.
func ConfigDiff(file, applied *config.Config) ([]FieldDiff, error) {
	a, err := flatConfig(file)
	if err != nil {
		return nil, err
	}
	b, err := flatConfig(applied)
	if err != nil {
		return nil, err
	}
	keys := slices.Sorted(maps.Keys(a))
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var out []FieldDiff
	for _, k := range keys {
		av, aok := a[k]
		bv, bok := b[k]
		if aok && bok && av == bv {
			continue
		}
		d := FieldDiff{Field: k, File: "(unset)", Applied: "(unset)", Spec: specField(k)}
		if aok {
			d.File = clipValue(av)
		}
		if bok {
			d.Applied = clipValue(bv)
		}
		out = append(out, d)
	}
	return out, nil
}

// flatConfig is c's canonical form as key path → JSON value: objects are
// walked down, arrays and scalars are leaves.
func flatConfig(c *config.Config) (map[string]string, error) {
	b, err := c.Canonical()
	if err != nil {
		return nil, err
	}
	var tree map[string]any
	if err := json.Unmarshal(b, &tree); err != nil {
		return nil, err
	}
	out := map[string]string{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		if m, ok := v.(map[string]any); ok && len(m) > 0 {
			for k, e := range m {
				p := k
				if prefix != "" {
					p = prefix + "." + k
				}
				walk(p, e)
			}
			return
		}
		j, _ := json.Marshal(v)
		out[prefix] = string(j)
	}
	walk("", tree)
	return out, nil
}

func clipValue(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// MachineWay is the way forward for a setting the Machine spec governs.
func MachineWay(d FieldDiff, machine string) string {
	return fmt.Sprintf("the node runs %s: after installation %s of Machine %s governs this setting (change it there: the watcher repaves), or put the file's value back", d.Applied, d.Spec, machine)
}

// ResetWay is the way forward for a setting only a reset changes.
func ResetWay(d FieldDiff) string {
	return fmt.Sprintf("%s as installed: an installed host cannot take a new value here; put it back, or reset the host (kubeslot-resetter) and bootstrap it again with the new file", d.Applied)
}

// checkConfig compares the configuration file the bootstrap runs with
// against the installation: the same fingerprint as the ownership record
// (what was installed), or no setting different from the applied
// configuration, is ok. Otherwise each differing setting is a finding, its
// want saying the way forward: the Machine spec for node settings, a reset
// for the rest. A missing or invalid file is a problem too: the boot-time
// bootstrap cannot run without it.
func checkConfig(root *hostroot.Root, file string, rec *ownership.Record, active *state.Applied) Result {
	if file == "" {
		return Result{Name: CheckConfig, Status: Skipped, Detail: "no configuration file given"}
	}
	local, err := root.Resolve(file)
	var data []byte
	if err == nil {
		data, err = hostroot.ReadRegular(local, config.MaxFileSize)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return result(CheckConfig, []Finding{{File: file, Field: "presence", Value: "missing",
			Want: "the configuration kubeslot-bootstrap.service runs with at every boot"}}, "")
	}
	if err != nil {
		return result(CheckConfig, []Finding{{File: file, Field: "content", Value: errText(err)}}, "")
	}
	cfg, err := config.Parse(file, data)
	if err == nil {
		err = cfg.NameFromHost(config.Hostname())
	}
	if err != nil {
		return result(CheckConfig, []Finding{{File: file, Field: "content", Value: err.Error(), Want: "a valid configuration (kubeslot config check)"}}, "")
	}
	if cfg.Fingerprint() == rec.Fingerprint {
		return result(CheckConfig, nil, fmt.Sprintf("%s is the configuration installed (fingerprint %s)", file, ownership.ShortFingerprint(rec.Fingerprint)))
	}
	if active == nil {
		return Result{Name: CheckConfig, Status: Skipped, Detail: file + " differs from the installed configuration, and there is no readable applied configuration to compare it with (see " + CheckApplied + ")"}
	}
	diffs, err := ConfigDiff(cfg, active.Config)
	if err != nil {
		return result(CheckConfig, []Finding{{File: file, Field: "content", Value: err.Error()}}, "")
	}
	var findings []Finding
	for _, d := range diffs {
		f := Finding{File: file, Field: d.Field, Value: d.File, Want: ResetWay(d)}
		if d.Spec != "" {
			f.Want = MachineWay(d, rec.Machine)
		}
		findings = append(findings, f)
	}
	return result(CheckConfig, findings, fmt.Sprintf("%s matches the applied configuration of slot %s", file, active.Slot))
}
