package nodeconfig

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/kubeslot/kubeslot/lib/config"
)

// Render returns the node's files for cfg: everything WriteFiles puts into
// a slot's rootfs except /etc/machine-id (EnsureMachineID). It fails, naming
// the setting, on a value the kubelet would refuse at start.
func Render(cfg *config.Config, creds *Credentials, opts Options) ([]File, error) {
	if creds == nil || len(creds.CAPEM) == 0 || len(creds.BootstrapKubeconfig) == 0 {
		return nil, errors.New("render node files: CA and bootstrap kubeconfig are required")
	}
	node, labels, err := check(cfg, opts)
	if err != nil {
		return nil, err
	}
	kc, err := kubeletConfigYAML(cfg, opts)
	if err != nil {
		return nil, err
	}
	files := []File{
		{"/etc/hostname", []byte(cfg.Machine.Name + "\n"), 0o644},
		{CAFile, creds.CAPEM, 0o644},
		{BootstrapKubeconfig, creds.BootstrapKubeconfig, 0o600},
		{KubeletConfig, []byte(kc), 0o644},
		{ContainerdConfig, []byte(containerdTOML(opts)), 0o644},
		{CNIConfig, []byte(cniLoopback), 0o644},
		{KubeletUnitPath, []byte(kubeletUnit(node, labels, opts)), 0o644},
	}
	if opts.OwnContainerd {
		files = append(files, File{ContainerdUnitPath, []byte(containerdUnit), 0o644})
	}
	for _, k := range sortedKeys(kernelDefaults) {
		files = append(files, File{sysctlFile(k), []byte(kernelDefaults[k] + "\n"), 0o444})
	}
	return files, nil
}

// Check reports what Render would refuse in cfg and opts (labels the
// kubelet refuses, bad taints, ports or node name) without credentials, so
// a stage can refuse a configuration before it changes anything.
func Check(cfg *config.Config, opts Options) error {
	_, _, err := check(cfg, opts)
	return err
}

func check(cfg *config.Config, opts Options) (node, labels string, err error) {
	if err := opts.check(); err != nil {
		return "", "", err
	}
	node = cfg.Machine.NodeName
	if node == "" {
		node = cfg.Machine.Name
	}
	if node == "" || !unitSafe(node) {
		return "", "", fmt.Errorf("machine.node_name %q: not a usable node name", node)
	}
	if labels, err = NodeLabels(cfg.Kubernetes.Labels); err != nil {
		return "", "", err
	}
	for i, s := range cfg.Kubernetes.Taints {
		if _, err := config.ParseTaint(s); err != nil {
			return "", "", fmt.Errorf("kubernetes.taints[%d] %q: %w", i, s, err)
		}
	}
	return node, labels, nil
}

// NodeLabels renders labels as the kubelet's --node-labels value (sorted
// "k=v" joined by commas), refusing keys the kubelet may not set on its own
// Node: it refuses to start with any of them. Those are keys in the
// kubernetes.io and k8s.io namespaces other than the kubelet's own (for
// example node-role.kubernetes.io/worker, which only a cluster
// administrator may set).
func NodeLabels(labels map[string]string) (string, error) {
	parts := make([]string, 0, len(labels))
	for _, k := range sortedKeys(labels) {
		if !config.KubeletMaySetLabel(k) {
			return "", fmt.Errorf("kubernetes.labels: %q: the kubelet may not set labels in the kubernetes.io or k8s.io namespaces other than %s and the namespaces %s (it refuses to start); set it on the Node from the cluster instead",
				k, strings.Join(config.KubeletLabels, ", "), strings.Join(config.KubeletLabelNamespaces, ", "))
		}
		kv := k + "=" + labels[k]
		if !unitSafe(kv) || strings.ContainsRune(kv, ',') {
			return "", fmt.Errorf("kubernetes.labels: %q: characters that cannot be passed to the kubelet", kv)
		}
		parts = append(parts, kv)
	}
	return strings.Join(parts, ","), nil
}

// unitSafe: only characters that need no quoting or escaping on a systemd
// ExecStart= line or in the kubelet's flag parsing ('%' is a systemd
// specifier, '$' a variable, quotes and spaces split words).
func unitSafe(s string) bool {
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.ContainsRune("._-/=,:", c):
		default:
			return false
		}
	}
	return true
}

type taint struct {
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
	Effect string `json:"effect"`
}

func kubeletConfigYAML(cfg *config.Config, opts Options) (string, error) {
	k := cfg.Kubernetes
	taints := make([]taint, 0, len(k.Taints))
	for i, s := range k.Taints {
		t, err := config.ParseTaint(s)
		if err != nil {
			return "", fmt.Errorf("kubernetes.taints[%d] %q: %w", i, s, err)
		}
		taints = append(taints, taint{t.Key, t.Value, t.Effect})
	}
	// JSON is YAML: values are marshalled, so no quoting mistakes.
	js := func(v any) string {
		b, _ := json.Marshal(v) // strings, slices and structs of strings: cannot fail
		return string(b)
	}
	dns := k.ClusterDNS
	if dns == nil {
		dns = []string{}
	}
	kubeletPort, healthzPort := opts.Ports()
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# Written by kubeslot; it is rewritten on every configure.
# kubelet API and healthz on loopback only: AlwaysAllow below is safe only
# there (kubectl logs/exec through the apiserver need address 0.0.0.0 and
# webhook authorization instead)
address: 127.0.0.1
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %s}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
registerNode: true
registerWithTaints: %s
rotateCertificates: true
clusterDomain: %s
clusterDNS: %s
# cgroups, as verified in an nspawn node on unified and hybrid hosts: the
# kubelet must accept cgroup v1 (hybrid hosts), cannot create QoS cgroups in
# the read-only v1 controllers nspawn gives it there, and must be told the
# driver containerd uses (containerd 1.6 cannot say)
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
# leave the shared kernel and network alone: the sysctls the kubelet wants
# are bound read-only over /proc/sys (see the unit), and the node shares the
# host's network namespace, whose firewall is not the kubelet's
protectKernelDefaults: false
makeIPTablesUtilChains: false
`, kubeletPort, healthzPort, CAFile, js(taints), js(k.ClusterDomain), js(dns))
	if !opts.KeepEviction {
		b.WriteString(`# no evictions or image GC: the node's filesystems are the host's, whose
# fill level the kubelet cannot judge from inside the node
evictionHard: {}
imageGCHighThresholdPercent: 100
`)
	}
	return b.String(), nil
}

func kubeletUnit(node, labels string, opts Options) string {
	args := []string{
		KubeletBinary,
		"--config=" + KubeletConfig,
		"--bootstrap-kubeconfig=" + BootstrapKubeconfig,
		"--kubeconfig=" + KubeletKubeconfig,
		"--cert-dir=" + CertDir,
		"--root-dir=" + RootDir,
		"--hostname-override=" + node,
	}
	if opts.NodeIP != "" {
		args = append(args, "--node-ip="+opts.NodeIP)
	}
	if labels != "" {
		args = append(args, "--node-labels="+labels)
	}
	var binds strings.Builder
	for _, k := range sortedKeys(kernelDefaults) {
		fmt.Fprintf(&binds, "BindReadOnlyPaths=%s:/proc/sys/%s\n", sysctlFile(k), k)
	}
	return fmt.Sprintf(`# Written by kubeslot; it is rewritten on every configure.
[Unit]
Description=kubelet (kubeslot node)
Requires=%[1]s
After=%[1]s
StartLimitIntervalSec=0

[Service]
ExecStart=%[2]s
# The OOM watcher opens /dev/kmsg and fails hard without it; the real one
# needs CAP_SYSLOG, which a node may lack. /dev/null opens, seeks and reads
# EOF: the kubelet just gets no kernel OOM events.
BindReadOnlyPaths=/dev/null:/dev/kmsg
# /proc/sys is read-only in the node: show the kubelet the values it wants
%[3]sRestart=always
RestartSec=2s

[Install]
WantedBy=multi-user.target
`, ContainerdUnit, strings.Join(args, " \\\n  "), binds.String())
}

// containerdTOML: the root on tmpfs by default (Options.ContainerdRoot),
// state in /run, the CRI stream server on an ephemeral loopback port, the
// cgroupfs driver the kubelet is told about, CNI from the Debian plugin
// directory (a cni_plugins artifact is unpacked there).
func containerdTOML(opts Options) string {
	root := opts.ContainerdRoot
	if root == "" {
		root = DefaultContainerdRoot
	}
	return fmt.Sprintf(`# Written by kubeslot; it is rewritten on every configure.
version = 2
root = %q
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
`, root, CNIBinDir)
}

// cniLoopback lets the CRI report NetworkReady (so the Node goes Ready)
// while creating no interface, route or firewall rule: pods get only lo.
// It is the only network kubeslot writes for now; a cluster CNI (a
// DaemonSet writing its own conflist next to it) takes over pod networking.
const cniLoopback = `{"cniVersion": "0.4.0", "name": "kubeslot-loopback", "plugins": [{"type": "loopback"}]}
`

// containerdUnit runs a containerd artifact's binary (upstream's unit,
// without the modprobe a node cannot do: host preparation loads overlay).
const containerdUnit = `# Written by kubeslot for the containerd artifact.
[Unit]
Description=containerd container runtime (kubeslot artifact)
After=local-fs.target

[Service]
ExecStart=` + ContainerdBinary + ` --config ` + ContainerdConfig + `
Type=notify
Delegate=yes
KillMode=process
Restart=always
RestartSec=5
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
OOMScoreAdjust=-999

[Install]
WantedBy=multi-user.target
`

// kubeconfig is the subset of the kubeconfig format written here.
type kubeconfig struct {
	APIVersion     string          `json:"apiVersion"`
	Kind           string          `json:"kind"`
	Clusters       []namedCluster  `json:"clusters"`
	Users          []namedUser     `json:"users"`
	Contexts       []namedContext  `json:"contexts"`
	CurrentContext string          `json:"current-context"`
	Preferences    map[string]bool `json:"preferences"`
}
type namedCluster struct {
	Name    string `json:"name"`
	Cluster struct {
		Server string `json:"server"`
		CAData string `json:"certificate-authority-data"`
	} `json:"cluster"`
}
type namedUser struct {
	Name string `json:"name"`
	User struct {
		Token string `json:"token"`
	} `json:"user"`
}
type namedContext struct {
	Name    string `json:"name"`
	Context struct {
		Cluster string `json:"cluster"`
		User    string `json:"user"`
	} `json:"context"`
}

// BootstrapKubeconfigFor writes the kubelet's bootstrap kubeconfig: the
// apiserver, its CA and the bootstrap token. The result holds the token.
func BootstrapKubeconfigFor(server string, caPEM []byte, token string) ([]byte, error) {
	if server == "" || len(caPEM) == 0 || token == "" {
		return nil, errors.New("bootstrap kubeconfig: server, CA and token are required")
	}
	var c namedCluster
	c.Name = "kubeslot"
	c.Cluster.Server = server
	c.Cluster.CAData = base64.StdEncoding.EncodeToString(caPEM)
	var u namedUser
	u.Name = "kubelet-bootstrap"
	u.User.Token = token
	var x namedContext
	x.Name = "kubelet-bootstrap@kubeslot"
	x.Context.Cluster, x.Context.User = c.Name, u.Name
	kc := kubeconfig{
		APIVersion: "v1", Kind: "Config",
		Clusters: []namedCluster{c}, Users: []namedUser{u}, Contexts: []namedContext{x},
		CurrentContext: x.Name, Preferences: map[string]bool{},
	}
	b, err := json.MarshalIndent(kc, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("bootstrap kubeconfig: %w", err)
	}
	return append(b, '\n'), nil
}
