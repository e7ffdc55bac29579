package config

import (
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

// reordered is minimal with sections and keys in another order, comments,
// blank lines, other whitespace, literal strings and dotted keys.
const reordered = `# a comment
[artifacts.kubelet]
sha256 = '1111111111111111111111111111111111111111111111111111111111111111'   # digest
url    =   "https://dl.k8s.io/release/v1.37.2/bin/linux/amd64/kubelet"

[rootfs]
sha256="0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
source="https://images.example.com/rootfs.tar.zst"


[cluster]
bootstrap_token = "abcdef.0123456789abcdef"
ca_file = "/etc/kubeslot/ca.crt"
server = "https://203.0.113.10:6443"

[machine]
name = "worker-1"

[kubernetes]
version = "1.37.2"
`

// explicitDefaults is minimal with every default spelled out, in other
// spellings where there are several.
var explicitDefaults = with(with(with(with(with(with(with(with(with(minimal,
	"kubernetes", `cluster_domain = "cluster.local"`),
	"isolation", `mode = "nspawn"`),
	"isolation", `slots = ["a", "b"]`),
	"timeouts", `download = "600s"`),
	"timeouts", `node_ready = "5m0s"`),
	"timeouts", `lock = "30s"`),
	"timeouts", `stop = "1m30s"`),
	"host", `install_packages = false`),
	"machine", `node_name = "worker-1"`)

func TestFingerprintStable(t *testing.T) {
	base := mustParse(t, minimal).Fingerprint()
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(base) {
		t.Fatalf("Fingerprint() = %q, want 64 hex digits", base)
	}
	same := map[string]string{
		"reordered, comments, whitespace": reordered,
		"defaults spelled out":            explicitDefaults,
		"v prefix":                        with(minimal, "kubernetes", `version = "v1.37.2"`),
		"uppercase digest":                with(minimal, "rootfs", `sha256 = "`+strings.ToUpper("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")+`"`),
		"another token":                   with(minimal, "cluster", `bootstrap_token = "zzzzzz.yyyyyyyyyyyyyyyy"`),
	}
	for name, doc := range same {
		if got := mustParse(t, doc).Fingerprint(); got != base {
			t.Errorf("%s: fingerprint %s, want %s", name, got, base)
		}
	}
}

func TestFingerprintChanges(t *testing.T) {
	base := mustParse(t, string(Example()))
	fp := base.Fingerprint()
	mutations := map[string]func(*Config){
		"name":             func(c *Config) { c.Machine.Name = "worker-2" },
		"node name":        func(c *Config) { c.Machine.NodeName = "other" },
		"server":           func(c *Config) { c.Cluster.Server = "https://203.0.113.11:6443" },
		"ca file":          func(c *Config) { c.Cluster.CAFile = "/etc/other.crt" },
		"kubeconfig":       func(c *Config) { c.Cluster.BootstrapToken, c.Cluster.Kubeconfig = "", "/etc/k.conf" },
		"version":          func(c *Config) { c.Kubernetes.Version = "1.37.3" },
		"label value":      func(c *Config) { c.Kubernetes.Labels["topology.kubernetes.io/zone"] = "zone-b" },
		"label removed":    func(c *Config) { delete(c.Kubernetes.Labels, "topology.kubernetes.io/zone") },
		"taint":            func(c *Config) { c.Kubernetes.Taints = nil },
		"cluster dns":      func(c *Config) { c.Kubernetes.ClusterDNS = []string{"10.96.0.11"} },
		"cluster domain":   func(c *Config) { c.Kubernetes.ClusterDomain = "example.internal" },
		"rootfs source":    func(c *Config) { c.RootFS.Source = "/srv/rootfs.tar" },
		"rootfs sha256":    func(c *Config) { c.RootFS.SHA256 = strings.Repeat("9", 64) },
		"kubelet url":      func(c *Config) { c.Artifacts.Kubelet.URL = "/srv/kubelet" },
		"containerd sha":   func(c *Config) { c.Artifacts.Containerd.SHA256 = strings.Repeat("9", 64) },
		"containerd gone":  func(c *Config) { c.Artifacts.Containerd = nil },
		"runc added":       func(c *Config) { c.Artifacts.Runc = &Artifact{URL: "/srv/runc", SHA256: strings.Repeat("9", 64)} },
		"slots":            func(c *Config) { c.Isolation.Slots = []string{"blue", "green"} },
		"download timeout": func(c *Config) { c.Timeouts.Download.Duration = time.Minute },
		"stop timeout":     func(c *Config) { c.Timeouts.Stop.Duration = time.Minute },
		"install packages": func(c *Config) { c.Host.InstallPackages = true },
	}
	for name, mutate := range mutations {
		c := mustParse(t, string(Example()))
		mutate(c)
		if c.Fingerprint() == fp {
			t.Errorf("%s: fingerprint unchanged", name)
		}
	}
	if base.Fingerprint() != fp {
		t.Error("Fingerprint is not deterministic")
	}
}

// Fingerprint applies defaults to a copy: the original is not modified,
// and an unparsed config with defaults missing gets the same answer.
func TestFingerprintDoesNotModify(t *testing.T) {
	lower := strings.Repeat("ab", 32)
	cfg := mustParse(t, with(minimal, "artifacts.containerd", `url = "/srv/containerd.tgz"`+"\n"+`sha256 = "`+lower+`"`))
	want := cfg.Fingerprint()
	raw := cfg.clone()
	raw.Isolation.Mode, raw.Isolation.Slots, raw.Timeouts = "", nil, Timeouts{}
	raw.Artifacts.Containerd.SHA256 = strings.ToUpper(lower)
	if got := raw.Fingerprint(); got != want {
		t.Errorf("fingerprint without defaults %s, want %s", got, want)
	}
	if raw.Artifacts.Containerd.SHA256 != strings.ToUpper(lower) || raw.Isolation.Mode != "" || raw.Isolation.Slots != nil {
		t.Error("Fingerprint modified its receiver")
	}
	if cfg.Artifacts.Containerd.SHA256 != lower {
		t.Error("clone shares the containerd artifact with the original")
	}
}

// Every Secret field, including ones added later, must stay out of the
// canonical form. Found by reflection so a new secret cannot be missed.
func TestCanonicalClearsEverySecret(t *testing.T) {
	cfg := mustParse(t, string(Example()))
	n := 0
	var fill func(v reflect.Value)
	fill = func(v reflect.Value) {
		switch v.Kind() {
		case reflect.Pointer:
			if v.IsNil() {
				v.Set(reflect.New(v.Type().Elem()))
			}
			fill(v.Elem())
		case reflect.Struct:
			for i := range v.NumField() {
				fill(v.Field(i))
			}
		}
		if v.Type() == secretType {
			n++
			v.SetString("zzsecretzz")
		}
	}
	fill(reflect.ValueOf(cfg).Elem())
	if n == 0 {
		t.Fatal("found no Secret fields; the walk is broken")
	}
	b, err := cfg.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "zzsecretzz") {
		t.Errorf("canonical form contains a secret: %s", b)
	}
}
