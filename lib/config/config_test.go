package config

import (
	"encoding/json"
	"errors"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestExampleParses(t *testing.T) {
	cfg, err := Parse("example.toml", Example())
	if err != nil {
		t.Fatalf("Parse(Example()):\n%v", err)
	}
	if cfg.Machine.Name != "worker-1" || cfg.Cluster.BootstrapToken.Reveal() != testToken {
		t.Errorf("unexpected example values: %+v", cfg)
	}
	if cfg.Artifacts.Containerd == nil || cfg.Artifacts.CNIPlugins == nil || cfg.Artifacts.Runc != nil {
		t.Errorf("example artifacts: containerd %v, cni %v, runc %v; want set, set, absent",
			cfg.Artifacts.Containerd, cfg.Artifacts.CNIPlugins, cfg.Artifacts.Runc)
	}
}

// Every setting must be shown in the example, set or commented out, so the
// example stays the reference operators copy from.
func TestExampleShowsEverySetting(t *testing.T) {
	text := string(Example())
	var walk func(prefix []string, typ reflect.Type)
	walk = func(prefix []string, typ reflect.Type) {
		for i := range typ.NumField() {
			f := typ.Field(i)
			if tomlName(f) == "-" {
				continue // not a setting
			}
			path := append(slices.Clip(prefix), tomlName(f))
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct && ft != durationType {
				header := "[" + strings.Join(path, ".") + "]"
				if !containsTable(text, header) && len(path) > 1 {
					t.Errorf("example lacks table %s", header)
				}
				walk(path, ft)
				continue
			}
			if ft.Kind() == reflect.Map {
				if !containsTable(text, "["+strings.Join(path, ".")+"]") {
					t.Errorf("example lacks table [%s]", strings.Join(path, "."))
				}
				continue
			}
			re := regexp.MustCompile(`(?m)^(# )?` + regexp.QuoteMeta(path[len(path)-1]) + ` = `)
			if !re.MatchString(text) {
				t.Errorf("example lacks %s", strings.Join(path, "."))
			}
		}
	}
	walk(nil, configType)
}

func containsTable(text, header string) bool {
	return regexp.MustCompile(`(?m)^(# )?` + regexp.QuoteMeta(header) + `$`).MatchString(text)
}

func TestDefaults(t *testing.T) {
	cfg := mustParse(t, minimal)
	checks := []struct {
		name      string
		got, want any
	}{
		{"node_name", cfg.Machine.NodeName, "worker-1"},
		{"mode", cfg.Isolation.Mode, "nspawn"},
		{"slots", cfg.Isolation.Slots, []string{"a", "b"}},
		{"cluster_domain", cfg.Kubernetes.ClusterDomain, "cluster.local"},
		{"download", cfg.Timeouts.Download.Duration, 10 * time.Minute},
		{"node_ready", cfg.Timeouts.NodeReady.Duration, 5 * time.Minute},
		{"lock", cfg.Timeouts.Lock.Duration, 30 * time.Second},
		{"stop", cfg.Timeouts.Stop.Duration, 90 * time.Second},
		{"install_packages", cfg.Host.InstallPackages, false},
		{"containerd", cfg.Artifacts.Containerd, (*Artifact)(nil)},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

// Accepted inputs other than the minimal one, and what they become.
func TestParseValid(t *testing.T) {
	upper := strings.ToUpper("abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789")
	pemText := testkit.CA(t)
	cases := []struct {
		name  string
		doc   string
		check func(*Config) bool
	}{
		{"v prefix is dropped", with(minimal, "kubernetes", `version = "v1.37.2"`),
			func(c *Config) bool { return c.Kubernetes.Version == "1.37.2" }},
		// Decision: uppercase digests are accepted and lowercased (some
		// vendors publish them that way); the fingerprint sees one form.
		{"uppercase sha256 is lowercased", with(minimal, "rootfs", `sha256 = "`+upper+`"`),
			func(c *Config) bool { return c.RootFS.SHA256 == strings.ToLower(upper) }},
		{"explicit node name, FQDN", with(minimal, "machine", `node_name = "worker-1.example.internal"`),
			func(c *Config) bool { return c.Machine.NodeName == "worker-1.example.internal" }},
		{"inline CA PEM", with(without(minimal, "cluster", "ca_file"), "cluster", `ca_pem = """`+"\n"+pemText+`"""`),
			func(c *Config) bool { return strings.Contains(c.Cluster.CAPEM, "BEGIN CERTIFICATE") }},
		{"kubeconfig instead of token", with(without(minimal, "cluster", "bootstrap_token"), "cluster", `kubeconfig = "/etc/kubeslot/join.kubeconfig"`),
			func(c *Config) bool { return c.Cluster.Kubeconfig != "" && c.Cluster.BootstrapToken == "" }},
		{"local paths for rootfs and artifacts", with(with(minimal, "rootfs", `source = "/srv/images/rootfs.tar.zst"`), "artifacts.runc", `url = "/srv/runc"`+"\n"+`sha256 = "`+strings.Repeat("ab", 32)+`"`),
			func(c *Config) bool {
				return c.RootFS.Source == "/srv/images/rootfs.tar.zst" && c.Artifacts.Runc.URL == "/srv/runc"
			}},
		{"labels, taints and DNS", with(with(minimal, "kubernetes", `taints = ["dedicated=batch:NoSchedule", "example.com/gpu:NoExecute", "k=:PreferNoSchedule"]`+"\n"+`cluster_dns = ["10.96.0.10", "fd00::a"]`),
			"kubernetes.labels", `"node.kubernetes.io/pool" = ""`+"\n"+`"example.com/zone" = "zone-a"`+"\n"+`plain = "Yes_1.0"`),
			func(c *Config) bool {
				return len(c.Kubernetes.Taints) == 3 && len(c.Kubernetes.ClusterDNS) == 2 && c.Kubernetes.Labels["example.com/zone"] == "zone-a"
			}},
		{"slots and timeouts", with(with(minimal, "isolation", `slots = ["blue", "green-2"]`), "timeouts", `download = "12m"`+"\n"+`stop = "2m"`),
			func(c *Config) bool {
				return c.Isolation.Slots[1] == "green-2" && c.Timeouts.Download.Duration == 12*time.Minute && c.Timeouts.Stop.Duration == 2*time.Minute
			}},
		{"empty mode means the default", with(minimal, "isolation", `mode = ""`),
			func(c *Config) bool { return c.Isolation.Mode == "nspawn" }},
		{"install packages", with(minimal, "host", `install_packages = true`),
			func(c *Config) bool { return c.Host.InstallPackages }},
		{"dotted keys and inline tables", "machine.name = \"worker-1\"\n" + strings.Replace(minimal, "[machine]\nname = \"worker-1\"\n", "", 1) + "[timeouts]\nlock = \"1m\"\n",
			func(c *Config) bool { return c.Machine.Name == "worker-1" && c.Timeouts.Lock.Duration == time.Minute }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := mustParse(t, c.doc)
			if !c.check(cfg) {
				t.Errorf("unexpected result: %+v", cfg)
			}
		})
	}
}

// The applied copy is persisted as JSON: it must come back identical,
// token included, with durations as strings.
func TestJSONRoundTrip(t *testing.T) {
	cfg := mustParse(t, string(Example()))
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"download":"10m0s"`) {
		t.Errorf("durations should be JSON strings: %s", b)
	}
	if !strings.Contains(string(b), testToken) {
		t.Errorf("JSON must keep the token for the persisted applied config: %s", b)
	}
	var back Config
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&back, cfg) {
		t.Errorf("round trip differs:\n got %+v\nwant %+v", back, *cfg)
	}
	if err := back.Validate(); err != nil {
		t.Errorf("Validate after round trip: %v", err)
	}
	if err := json.Unmarshal([]byte(`{"timeouts":{"lock":"soon"}}`), &back); err == nil {
		t.Error("a bad duration in JSON should fail to decode")
	}
}

func TestSummary(t *testing.T) {
	cfg := mustParse(t, string(Example()))
	want := "machine worker-1, node worker-1, kubernetes 1.37.2, isolation nspawn, rootfs sha256:0123456789ab"
	if got := cfg.Summary(); got != want {
		t.Errorf("Summary() = %q, want %q", got, want)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.toml")
	bad := filepath.Join(dir, "bad.toml")
	big := filepath.Join(dir, "big.toml")
	if err := os.WriteFile(good, []byte(minimal), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte(with(minimal, "cluster", `server = "ftp://x"`)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(big, []byte(minimal+strings.Repeat("# padding\n", MaxFileSize/10+1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(good); err != nil {
		t.Errorf("Load(good): %v", err)
	}
	_, err := Load(bad)
	if err == nil || !strings.HasPrefix(err.Error(), bad+":5: cluster.server") {
		t.Errorf("Load(bad) = %v, want an error naming %s line 5", err, bad)
	}
	if _, err := Load(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("Load(big) = %v, want a size error", err)
	}
	if _, err := Load(filepath.Join(dir, "absent.toml")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load(absent) = %v, want a not-exist error", err)
	}
	// A stage's load says that nothing changed, and keeps the field.
	if _, err := LoadForStage(good); err != nil {
		t.Errorf("LoadForStage(good): %v", err)
	}
	if _, err := LoadForStage(bad); err == nil || !strings.HasPrefix(err.Error(), "invalid configuration, nothing was changed on the host: "+bad+":5: cluster.server") {
		t.Errorf("LoadForStage(bad) = %v", err)
	}
}
