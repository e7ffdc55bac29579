package nodeconfig

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
)

// testConfig parses a valid configuration with labels, taints and DNS; extra
// TOML (whole tables) is appended.
func testConfig(t *testing.T, ca, extra string) *config.Config {
	t.Helper()
	return testhost.Config(t, testhost.Doc{
		MachineLines: `node_name = "worker-1.example.internal"`,
		Server:       "https://203.0.113.10:6443",
		CA:           ca,
		KubernetesLines: `cluster_dns = ["10.96.0.10", "fd00::a"]
cluster_domain = "corp.local"
taints = ["dedicated=batch:NoSchedule", "gpu:NoExecute"]`,
		Tables: `
[kubernetes.labels]
"topology.kubernetes.io/zone" = "zone-a"
"example.com/team" = "infra"
"node.kubernetes.io/pool" = "p1"

[node.registry_mirrors]
"registry.k8s.io" = ["http://127.0.0.1:5000", "https://mirror.example"]

[node.kube_reserved]
memory = "256Mi"

[node.system_reserved]
cpu = "100m"
` + extra,
	})
}

func render(t *testing.T, cfg *config.Config, opts Options) map[string]File {
	t.Helper()
	creds, err := LoadCredentials(nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	files, err := Render(cfg, creds, opts)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]File{}
	for _, f := range files {
		if _, dup := m[f.Path]; dup {
			t.Errorf("%s rendered twice", f.Path)
		}
		m[f.Path] = f
	}
	return m
}

func TestRenderKeySettings(t *testing.T) {
	cfg := testConfig(t, testkit.CA(t), "")
	files := render(t, cfg, Options{KubeletPort: 12345, HealthzPort: 12346, NodeIP: "127.0.0.1"})

	var kc map[string]any
	if err := yaml.Unmarshal(files[KubeletConfig].Data, &kc); err != nil {
		t.Fatalf("kubelet config is not YAML: %v\n%s", err, files[KubeletConfig].Data)
	}
	want := map[string]any{
		"kind": "KubeletConfiguration", "port": float64(12345), "healthzPort": float64(12346),
		"address": "127.0.0.1", "healthzBindAddress": "127.0.0.1", "readOnlyPort": float64(0),
		// the kubelet API, secured: webhook authentication and authorization, a cluster-issued serving certificate
		"authentication": map[string]any{"anonymous": map[string]any{"enabled": false},
			"webhook": map[string]any{"enabled": true, "cacheTTL": "2m0s"}, "x509": map[string]any{"clientCAFile": CAFile}},
		"authorization": map[string]any{"mode": "Webhook",
			"webhook": map[string]any{"cacheAuthorizedTTL": "5m0s", "cacheUnauthorizedTTL": "30s"}},
		"serverTLSBootstrap": true,
		"clusterDomain":      "corp.local", "clusterDNS": []any{"10.96.0.10", "fd00::a"},
		"registerWithTaints": []any{
			map[string]any{"key": "dedicated", "value": "batch", "effect": "NoSchedule"},
			map[string]any{"key": "gpu", "effect": "NoExecute"},
		},
		// the production cgroup profile, reservations from [node]
		"cgroupDriver": "systemd", "cgroupsPerQOS": true, "enforceNodeAllocatable": []any{"pods"},
		"kubeReserved": map[string]any{"memory": "256Mi"}, "systemReserved": map[string]any{"cpu": "100m"},
		"protectKernelDefaults": false, "makeIPTablesUtilChains": false, "rotateCertificates": true,
		"containerRuntimeEndpoint": "unix://" + ContainerdSocket, // also what lib/cri dials from the host
		// eviction and image GC at the kubelet's defaults
		"evictionHard": nil, "imageGCHighThresholdPercent": nil, "failCgroupV1": nil,
		"oomScoreAdj": nil, // the kubelet's -999 (a real host gives it CAP_SYS_RESOURCE)
	}
	for k, v := range want {
		if got, _ := json.Marshal(kc[k]); string(got) != mustJSON(v) {
			t.Errorf("kubelet config %s = %s, want %s", k, got, mustJSON(v))
		}
	}

	unit := string(files[KubeletUnitPath].Data)
	for _, w := range []string{
		"--hostname-override=worker-1.example.internal",
		"--node-labels=example.com/team=infra,node.kubernetes.io/pool=p1,topology.kubernetes.io/zone=zone-a",
		"--node-ip=127.0.0.1", "--cert-dir=/var/lib/kubelet/pki", "--kubeconfig=/var/lib/kubelet/kubeconfig",
		"--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
		"BindReadOnlyPaths=/dev/null:/dev/kmsg\n",
		"BindReadOnlyPaths=/etc/kubernetes/sysctl/vm_overcommit_memory:/proc/sys/vm/overcommit_memory\n",
		"WantedBy=multi-user.target\n", "Wants=containerd.service\nAfter=containerd.service\n",
	} {
		if !strings.Contains(unit, w) {
			t.Errorf("kubelet unit lacks %q:\n%s", w, unit)
		}
	}
	if strings.Contains(unit, "\nRequires=") { // a restart of containerd alone must not restart the kubelet (nspawn.Backend.restartServices)
		t.Errorf("kubelet unit requires a unit:\n%s", unit)
	}
	if n := strings.Count(unit, ":/proc/sys/"); n != len(kernelDefaults) {
		t.Errorf("kubelet unit binds %d sysctls, want %d", n, len(kernelDefaults))
	}
	for k, v := range kernelDefaults {
		f, ok := files[sysctlFile(k)]
		if !ok || string(f.Data) != v+"\n" || f.Mode != 0o444 {
			t.Errorf("sysctl file for %s: %+v", k, f)
		}
	}

	ctd := string(files[ContainerdConfig].Data)
	for _, w := range []string{`root = "/var/lib/containerd"`, "SystemdCgroup = true", `bin_dir = "/opt/cni/bin"`,
		`conf_dir = "/etc/cni/net.d"`, `snapshotter = "overlayfs"`, `sandbox_image = "registry.k8s.io/pause:3.10.1"`,
		`config_path = "/etc/containerd/certs.d"`, "restrict_oom_score_adj = false"} {
		if !strings.Contains(ctd, w) {
			t.Errorf("containerd config lacks %q:\n%s", w, ctd)
		}
	}
	if err := toml.Unmarshal(files[ContainerdConfig].Data, &map[string]any{}); err != nil { // no sandbox_image quoting mistakes
		t.Errorf("containerd config is not TOML: %v", err)
	}
	// cluster CNI: nothing written to the (host-kept) config directory, the rootfs's plugins seeded before containerd
	if _, ok := files[CNIConfig]; ok {
		t.Error("a loopback network written in cluster CNI mode")
	}
	if u := string(files[CNISeedUnitPath].Data); !strings.Contains(u, "Before=containerd.service") || !strings.Contains(u, "/opt/cni/bin/$${f##*/}") {
		t.Errorf("CNI seed unit:\n%s", u)
	}
	hosts := string(files["/etc/containerd/certs.d/registry.k8s.io/hosts.toml"].Data)
	if !strings.Contains(hosts, `server = "https://registry.k8s.io"`) || !strings.Contains(hosts, `[host."http://127.0.0.1:5000"]`) ||
		strings.Index(hosts, "127.0.0.1:5000") > strings.Index(hosts, "mirror.example") {
		t.Errorf("registry mirrors, in order:\n%s", hosts)
	}
	if _, ok := files[ContainerdUnitPath]; ok {
		t.Error("containerd unit written although no containerd artifact was asked for")
	}
	if got := string(files["/etc/hostname"].Data); got != "worker-1\n" {
		t.Errorf("hostname %q", got)
	}

	bk := files[BootstrapKubeconfig]
	if bk.Mode != 0o600 {
		t.Errorf("bootstrap kubeconfig mode %v, want 0600 (it holds the token)", bk.Mode)
	}
	var kcfg struct {
		Clusters []struct {
			Cluster struct {
				Server string `json:"server"`
				CA     string `json:"certificate-authority-data"`
			} `json:"cluster"`
		} `json:"clusters"`
		Users []struct {
			User struct {
				Token string `json:"token"`
			} `json:"user"`
		} `json:"users"`
		Current string `json:"current-context"`
	}
	if err := json.Unmarshal(bk.Data, &kcfg); err != nil {
		t.Fatal(err)
	}
	ca, _ := base64.StdEncoding.DecodeString(kcfg.Clusters[0].Cluster.CA)
	if kcfg.Clusters[0].Cluster.Server != cfg.Cluster.Server || string(ca) != cfg.Cluster.CAPEM ||
		kcfg.Users[0].User.Token != testhost.Token || kcfg.Current == "" {
		t.Errorf("bootstrap kubeconfig: %s", bk.Data)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestRenderOptions(t *testing.T) {
	cfg := testConfig(t, testkit.CA(t), "")
	files := render(t, cfg, Options{OwnContainerd: true})
	kc := string(files[KubeletConfig].Data)
	for _, w := range []string{"port: 10250\n", "healthzPort: 10248\n", "address: 0.0.0.0\n"} {
		if !strings.Contains(kc, w) {
			t.Errorf("defaults: kubelet config lacks %q", w)
		}
	}
	if strings.Contains(string(files[KubeletUnitPath].Data), "--node-ip") {
		t.Error("--node-ip given without Options.NodeIP")
	}
	if u, ok := files[ContainerdUnitPath]; !ok || !strings.Contains(string(u.Data), "ExecStart="+ContainerdBinary) {
		t.Errorf("OwnContainerd: containerd unit %q", u.Data)
	}
	for _, bad := range []Options{{KubeletPort: 70000}, {KubeletPort: 5, HealthzPort: 5}, {NodeIP: "10.0.0"},
		{Cgroups: "v1"}, {Snapshotter: "zfs"}} {
		if err := Check(cfg, bad); err == nil {
			t.Errorf("options %+v accepted", bad)
		}
	}
}

// TestRenderFallbackAndSandbox: the cgroup fallback is named in the file;
// the rig's compromises (loopback network, native snapshotter, restricted
// oom_score_adj) appear only when set; bridge mode writes containerd's
// template for the Node's podCIDR.
func TestRenderFallbackAndSandbox(t *testing.T) {
	cfg := testConfig(t, testkit.CA(t), "")
	files := render(t, cfg, Options{Cgroups: CgroupsNoControllers, LoopbackCNI: true, Snapshotter: "native", RestrictOOMScoreAdj: true})
	kc := string(files[KubeletConfig].Data)
	for _, w := range []string{"profile cgroupfs-no-qos", "cgroupDriver: cgroupfs\n", "cgroupsPerQOS: false\n", "failCgroupV1: false\n",
		"oomScoreAdj: 0\n"} {
		if !strings.Contains(kc, w) {
			t.Errorf("fallback: kubelet config lacks %q:\n%s", w, kc)
		}
	}
	ctd := string(files[ContainerdConfig].Data)
	for _, w := range []string{"SystemdCgroup = false", `snapshotter = "native"`, "restrict_oom_score_adj = true", `bin_dir = "/usr/lib/cni"`} {
		if !strings.Contains(ctd, w) {
			t.Errorf("sandbox: containerd config lacks %q:\n%s", w, ctd)
		}
	}
	var cni map[string]any
	if err := json.Unmarshal(files[CNIConfig].Data, &cni); err != nil {
		t.Errorf("loopback CNI conflist: %v", err)
	}
	if _, ok := files[CNISeedUnitPath]; ok {
		t.Error("CNI seed unit written with a loopback network")
	}

	cfg.Node.CNI.Mode = config.CNIBridge
	files = render(t, cfg, Options{})
	ctd = string(files[ContainerdConfig].Data)
	if !strings.Contains(ctd, `conf_template = "/etc/containerd/cni-bridge.template"`) || !strings.Contains(ctd, `bin_dir = "/usr/lib/cni"`) {
		t.Errorf("bridge: containerd config:\n%s", ctd)
	}
	tmpl := string(files[CNITemplate].Data)
	var parsed map[string]any
	if err := json.Unmarshal(files[CNITemplate].Data, &parsed); err != nil || !strings.Contains(tmpl, `"subnet": "{{.PodCIDR}}"`) {
		t.Errorf("bridge template (%v):\n%s", err, tmpl)
	}
	// containerd's CRI plugin brings lo up with a network of its own: a loopback entry here runs the plugin twice
	if strings.Contains(tmpl, `"loopback"`) {
		t.Errorf("bridge template with a loopback entry:\n%s", tmpl)
	}
}

func TestKubeletLabelRules(t *testing.T) {
	for key, ok := range map[string]bool{
		"node-role.kubernetes.io/worker": false, // only an administrator may set it
		"example.k8s.io/x":               false,
		"kubernetes.io/team":             false,
		"node.kubernetes.io/pool":        true,
		"kubelet.kubernetes.io/x":        true,
		"a.node.kubernetes.io/x":         true,
		"topology.kubernetes.io/zone":    true,
		"kubernetes.io/hostname":         true,
		"example.com/team":               true,
		"plain":                          true,
		"notkubernetes.io/x":             true,
	} {
		if got := config.KubeletMaySetLabel(key); got != ok {
			t.Errorf("config.KubeletMaySetLabel(%q) = %v, want %v", key, got, ok)
		}
	}
	cfg := testConfig(t, testkit.CA(t), "")
	cfg.Kubernetes.Labels["node-role.kubernetes.io/worker"] = ""
	err := Check(cfg, Options{})
	if err == nil || !strings.Contains(err.Error(), "node-role.kubernetes.io/worker") {
		t.Errorf("forbidden label: %v", err)
	}
}

func TestLoadCredentialsFromHostFiles(t *testing.T) {
	root := testkit.Root(t)
	ca := testkit.CA(t)
	write := func(p, data string) {
		local := filepath.Join(root.Prefix(), p)
		if err := os.MkdirAll(filepath.Dir(local), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(local, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg := testConfig(t, ca, "")
	cfg.Cluster.CAPEM, cfg.Cluster.CAFile = "", "/etc/kubeslot/ca.crt"
	cfg.Cluster.BootstrapToken, cfg.Cluster.Kubeconfig = "", "/etc/kubeslot/join.kubeconfig"

	if _, err := LoadCredentials(root, cfg); err == nil || !strings.Contains(err.Error(), "ca_file") {
		t.Errorf("missing CA file: %v", err)
	}
	write("/etc/kubeslot/ca.crt", "not a certificate")
	if _, err := LoadCredentials(root, cfg); err == nil || !strings.Contains(err.Error(), "no PEM CERTIFICATE") {
		t.Errorf("garbage CA: %v", err)
	}
	write("/etc/kubeslot/ca.crt", ca)
	if _, err := LoadCredentials(root, cfg); err == nil || !strings.Contains(err.Error(), "cluster.kubeconfig") {
		t.Errorf("missing kubeconfig: %v", err)
	}
	write("/etc/kubeslot/join.kubeconfig", "apiVersion: v1\nkind: Config\n")
	c, err := LoadCredentials(root, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if string(c.CAPEM) != ca || string(c.BootstrapKubeconfig) != "apiVersion: v1\nkind: Config\n" {
		t.Errorf("credentials: %+v", c)
	}
}

func TestWriteFilesStaysInRootfs(t *testing.T) {
	dir := t.TempDir()
	rootfs, outside := filepath.Join(dir, "rootfs"), filepath.Join(dir, "outside")
	for _, d := range []string{filepath.Join(rootfs, "etc"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A link at a file's place is replaced, not written through.
	if err := os.Symlink(filepath.Join(outside, "victim"), filepath.Join(rootfs, "etc/hostname")); err != nil {
		t.Fatal(err)
	}
	files := []File{{"/etc/hostname", []byte("n\n"), 0o644}, {"/etc/kubernetes/a.conf", []byte("x"), 0o600}}
	changed, err := WriteFiles(rootfs, files)
	if err != nil || len(changed) != 2 {
		t.Fatalf("WriteFiles: %v, changed %v", err, changed)
	}
	if fi, err := os.Lstat(filepath.Join(rootfs, "etc/hostname")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("etc/hostname: %v %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(rootfs, "etc/kubernetes/a.conf")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("a.conf: %v %v", fi, err)
	}
	if changed, err := WriteFiles(rootfs, files); err != nil || len(changed) != 0 {
		t.Errorf("second WriteFiles: %v, changed %v", err, changed)
	}
	// A directory link leaving the rootfs is refused.
	if err := os.Symlink("../../outside", filepath.Join(rootfs, "etc/containerd")); err != nil {
		t.Fatal(err)
	}
	if _, err := WriteFiles(rootfs, []File{{"/etc/containerd/config.toml", []byte("x"), 0o644}}); err == nil {
		t.Error("write through an escaping link accepted")
	}
	if err := os.Symlink(outside, filepath.Join(rootfs, "etc/cni")); err != nil {
		t.Fatal(err)
	}
	if _, err := WriteFiles(rootfs, []File{{"/etc/cni/x", []byte("x"), 0o644}}); err == nil {
		t.Error("write through an absolute link accepted")
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("files written outside the rootfs: %v", ents)
	}
	if _, err := WriteFiles(rootfs, []File{{"etc/relative", nil, 0o644}}); err == nil {
		t.Error("relative path accepted")
	}
}

func TestEnsureMachineID(t *testing.T) {
	rootfs := t.TempDir()
	if err := os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(rootfs, "etc/machine-id")
	if err := os.WriteFile(p, []byte("uninitialized\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	wrote, err := EnsureMachineID(rootfs)
	if err != nil || !wrote {
		t.Fatalf("EnsureMachineID: %v %v", wrote, err)
	}
	id, _ := os.ReadFile(p)
	if !validMachineID(id) {
		t.Fatalf("machine-id %q", id)
	}
	if wrote, err := EnsureMachineID(rootfs); err != nil || wrote {
		t.Errorf("a valid id was replaced: %v %v", wrote, err)
	}
	if again, _ := os.ReadFile(p); string(again) != string(id) {
		t.Errorf("machine-id changed: %q -> %q", id, again)
	}
}

// TestRenderedUnitsEscapeDollars: systemd expands $NAME on ExecStart= lines
// itself, so every shell variable in a rendered unit must be written $$.
func TestRenderedUnitsEscapeDollars(t *testing.T) {
	cfg := testConfig(t, testkit.CA(t), "")
	files := render(t, cfg, Options{CgroupV1Writable: true, Preload: []string{CacheMount + "/sha256/" + strings.Repeat("a", 64)}})
	units := 0
	for p, f := range files {
		if !strings.HasSuffix(p, ".service") {
			continue
		}
		units++
		for _, l := range strings.Split(string(f.Data), "\n") {
			if !strings.HasPrefix(l, "ExecStart") { // ExecStart= and ExecStartPre=
				continue
			}
			if rest := strings.ReplaceAll(l, "$$", ""); strings.Contains(rest, "$") {
				t.Errorf("%s: unescaped $ in %q", p, l)
			}
		}
	}
	if units < 4 {
		t.Errorf("only %d units rendered", units)
	}
	dropIn := string(files[ContainerdDropIn].Data)
	for _, w := range []string{"Wants=" + CNISeedUnit, "Requires=" + CgroupRWUnit, "After=" + CgroupRWUnit} {
		if !strings.Contains(dropIn, w) {
			t.Errorf("containerd drop-in lacks %q:\n%s", w, dropIn)
		}
	}
}

// TestSandboxCgroupUnitsOrder: in a sandbox with writable v1 controllers
// the remount runs at every boot (a warm standby's too), out of a switch's
// downtime; the removal of the last node's empty cgroups runs at a serving
// start before the kubelet, beside containerd's start, not after it.
func TestSandboxCgroupUnitsOrder(t *testing.T) {
	files := render(t, testConfig(t, testkit.CA(t), ""), Options{CgroupV1Writable: true})
	unit := func(p string) string { return string(files[p].Data) }
	if !strings.Contains(unit(NodeTargetDropIn), " "+CgroupRWUnit) {
		t.Errorf("the boot does not want the remount:\n%s", unit(NodeTargetDropIn))
	}
	if strings.Contains(unit(CgroupRWUnitPath), servingCondition) || strings.Contains(unit(CgroupRWUnitPath), "-delete") {
		t.Errorf("the remount is gated or removes cgroups:\n%s", unit(CgroupRWUnitPath))
	}
	clean := unit(CgroupCleanUnitPath)
	for _, w := range []string{servingCondition, "After=" + CgroupRWUnit + "\n", "Before=" + KubeletUnit + "\n", "-type d -delete"} {
		if !strings.Contains(clean, w) {
			t.Errorf("the clean-up lacks %q:\n%s", w, clean)
		}
	}
	if strings.Contains(clean, "After="+ContainerdUnit) {
		t.Errorf("the clean-up waits for containerd:\n%s", clean)
	}
	kubelet := unit(KubeletUnitPath)
	if !strings.Contains(kubelet, "Wants="+CgroupCleanUnit+"\nAfter="+CgroupCleanUnit+"\n") || strings.Contains(kubelet, "ExecStartPre") {
		t.Errorf("the kubelet does not wait for the clean-up unit:\n%s", kubelet)
	}
	prod := render(t, testConfig(t, testkit.CA(t), ""), Options{})
	if _, ok := prod[CgroupCleanUnitPath]; ok || strings.Contains(string(prod[NodeTargetDropIn].Data), CgroupRWUnit) {
		t.Error("a production node got the sandbox's cgroup units")
	}
}

// TestPreloadUnits: the preload before the kubelet is skipped by systemd
// while the list's marker exists; the same script runs at every start of
// containerd (wanted by it, not ordered before the kubelet, at idle
// priority); both start only on the serving slot, and another list names
// another marker.
func TestPreloadUnits(t *testing.T) {
	opts := Options{Preload: []string{CacheMount + "/x"}}
	files := render(t, testConfig(t, testkit.CA(t), ""), opts)
	pre, verify, kubelet := string(files[PreloadUnitPath].Data), string(files[PreloadVerifyUnitPath].Data), string(files[KubeletUnitPath].Data)
	complete := preloadComplete(opts.Preload, "overlayfs")
	run := "ExecStart=/bin/sh " + PreloadScript + " " + PreloadList + " " + PreloadRecords + " " + complete + "\n"
	for _, w := range []string{"Before=" + KubeletUnit, "ConditionPathExists=!" + complete + "\n", run, "RemainAfterExit=yes"} {
		if !strings.Contains(pre, w) {
			t.Errorf("the preload unit lacks %q:\n%s", w, pre)
		}
	}
	for _, w := range []string{servingCondition, "After=" + ContainerdUnit, "After=" + PreloadUnit, run, "RemainAfterExit=yes", "PartOf=" + ContainerdUnit + "\n", "CPUSchedulingPolicy=idle\n"} {
		if !strings.Contains(verify, w) {
			t.Errorf("the verify unit lacks %q:\n%s", w, verify)
		}
	}
	if strings.Contains(verify, KubeletUnit) || strings.Contains(verify, "ConditionPathExists=!") {
		t.Errorf("the verify unit is ordered before the kubelet or skipped by the marker:\n%s", verify)
	}
	if !strings.Contains(kubelet, "Wants="+PreloadUnit+"\n") || strings.Contains(kubelet, PreloadVerifyUnit) {
		t.Errorf("the kubelet does not want the preload, or wants its check:\n%s", kubelet)
	}
	if ctd := string(files[ContainerdDropIn].Data); !strings.Contains(ctd, "Wants="+PreloadVerifyUnit+"\n") {
		t.Errorf("containerd does not want the preload's check:\n%s", ctd)
	}
	if preloadComplete([]string{CacheMount + "/y"}, "overlayfs") == complete || preloadComplete(opts.Preload, "native") == complete {
		t.Error("another list or snapshotter names the same marker")
	}
}

// TestServingGatesTheNodeUnits: containerd, the kubelet and the units that
// feed them start only in the serving slot (a warm standby runs none of
// them), in every profile; the serving file itself is the backend's, never
// rendered (a configure must not make a target serve).
func TestServingGatesTheNodeUnits(t *testing.T) {
	cfg := testConfig(t, testkit.CA(t), "")
	for name, opts := range map[string]Options{
		"production": {},
		"sandbox":    {CgroupV1Writable: true, LoopbackCNI: true, Preload: []string{CacheMount + "/x"}},
	} {
		files := render(t, cfg, opts)
		if _, ok := files[ServingFile]; ok {
			t.Errorf("%s: %s rendered", name, ServingFile)
		}
		gated := []string{KubeletUnitPath, ContainerdDropIn}
		if opts.CgroupV1Writable {
			gated = append(gated, CgroupCleanUnitPath, PreloadUnitPath, PreloadVerifyUnitPath)
		}
		for _, p := range gated {
			f, ok := files[p]
			if !ok || !strings.Contains(string(f.Data), "\n"+servingCondition) {
				t.Errorf("%s: %s is not gated on %s:\n%s", name, p, ServingFile, f.Data)
			}
		}
	}
}

// TestRenderNVIDIARuntime: with the toolkit's runtime in the image,
// containerd gets an "nvidia" runtime and makes it the default (the device
// plugin's documented setup); without it, the config names no such runtime.
func TestRenderNVIDIARuntime(t *testing.T) {
	cfg := testConfig(t, testkit.CA(t), "")
	plain := string(render(t, cfg, Options{})[ContainerdConfig].Data)
	if strings.Contains(plain, "nvidia") {
		t.Errorf("containerd config names nvidia without the option:\n%s", plain)
	}
	data := render(t, cfg, Options{NVIDIARuntime: NVIDIARuntimeBinary})[ContainerdConfig].Data
	var doc struct {
		Plugins map[string]struct {
			Containerd struct {
				Default  string `toml:"default_runtime_name"`
				Runtimes map[string]struct {
					Type    string `toml:"runtime_type"`
					Options map[string]any
				}
			}
		}
	}
	if err := toml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("containerd config: %v\n%s", err, data)
	}
	ctd := doc.Plugins["io.containerd.grpc.v1.cri"].Containerd
	nv, ok := ctd.Runtimes["nvidia"]
	if ctd.Default != "nvidia" || !ok || nv.Type != "io.containerd.runc.v2" || nv.Options["BinaryName"] != NVIDIARuntimeBinary ||
		nv.Options["SystemdCgroup"] != true || ctd.Runtimes["runc"].Type == "" {
		t.Errorf("nvidia runtime: %+v\n%s", ctd, data)
	}
	files := render(t, cfg, Options{NVIDIARuntime: NVIDIARuntimeBinary})
	unit, ok := files[NVIDIALdconfigUnitPath]
	if !ok || !strings.Contains(string(unit.Data), "\nExecStart=/sbin/ldconfig -X\n") || !strings.Contains(string(unit.Data), "\n"+servingCondition) {
		t.Errorf("ldconfig unit:\n%s", unit.Data)
	}
	if dropIn := string(files[ContainerdDropIn].Data); !strings.Contains(dropIn, "Wants="+NVIDIALdconfigUnit+"\nAfter="+NVIDIALdconfigUnit+"\n") {
		t.Errorf("containerd does not wait for the ldconfig unit:\n%s", dropIn)
	}
	if _, ok := render(t, cfg, Options{})[NVIDIALdconfigUnitPath]; ok {
		t.Error("ldconfig unit written without the NVIDIA runtime")
	}
}
