package nodeconfig

import (
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
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
	kc, err := kubeletConfig(cfg, opts)
	if err != nil {
		return nil, err
	}
	files := []File{
		{"/etc/hostname", []byte(cfg.Machine.Name + "\n"), 0o644},
		// The kubelet's own files are root's alone (0600, as the CIS
		// benchmark's worker node section asks): only the kubelet, which
		// runs as root, reads them.
		{CAFile, creds.CAPEM, 0o600},
		{BootstrapKubeconfig, creds.BootstrapKubeconfig, 0o600},
		{KubeletConfig, kc, 0o600},
		{ContainerdConfig, []byte(containerdTOML(cfg, opts)), 0o644},
		{KubeletUnitPath, []byte(kubeletUnit(node, labels, opts)), 0o600},
		{NodeTargetDropIn, []byte(nodeTargetDropIn(opts)), 0o644},
	}
	switch cniMode(cfg, opts) {
	case cniLoopbackMode:
		files = append(files, File{CNIConfig, []byte(cniLoopback), 0o644})
	case config.CNIBridge:
		files = append(files, File{CNITemplate, []byte(cniBridgeTemplate), 0o644})
	case config.CNICluster:
		files = append(files, File{CNISeedUnitPath, []byte(cniSeedUnit), 0o644})
	}
	if opts.OwnContainerd {
		files = append(files, File{ContainerdUnitPath, []byte(containerdUnit), 0o644})
	}
	files = append(files, registryHosts(cfg.Node.RegistryMirrors)...)
	var ctdDeps strings.Builder
	if cniMode(cfg, opts) == config.CNICluster {
		fmt.Fprintf(&ctdDeps, "Wants=%[1]s\nAfter=%[1]s\n", CNISeedUnit)
	}
	if opts.NVIDIARuntime != "" {
		files = append(files, File{NVIDIALdconfigUnitPath, []byte(nvidiaLdconfigUnit), 0o644})
		fmt.Fprintf(&ctdDeps, "Wants=%[1]s\nAfter=%[1]s\n", NVIDIALdconfigUnit)
	}
	if len(opts.Preload) > 0 {
		fmt.Fprintf(&ctdDeps, "Wants=%s\n", PreloadVerifyUnit)
	}
	if opts.CgroupV1Writable {
		files = append(files,
			File{CgroupRWUnitPath, []byte(cgroupRWUnit), 0o644},
			File{CgroupCleanUnitPath, []byte(cgroupCleanUnit), 0o644})
		fmt.Fprintf(&ctdDeps, "Requires=%[1]s\nAfter=%[1]s\n", CgroupRWUnit)
	}
	// containerd pulls in the units it needs before it (the kubelet unit
	// requires containerd, and Start starts the kubelet), and runs only in
	// the serving slot: the drop-in applies to the rootfs's own unit too.
	files = append(files, File{ContainerdDropIn, []byte("# Written by kubeslot; it is rewritten on every configure.\n[Unit]\n" +
		servingCondition + ctdDeps.String()), 0o644})
	if len(opts.Preload) > 0 {
		files = append(files,
			File{PreloadList, []byte(strings.Join(opts.Preload, "\n") + "\n"), 0o644},
			File{PreloadScript, preloadScript, 0o755},
			File{PreloadUnitPath, []byte(preloadUnit(opts, false)), 0o644},
			File{PreloadVerifyUnitPath, []byte(preloadUnit(opts, true)), 0o644})
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
	} else {
		// The host's address as the pre-start hook found it at this start
		// (NodeIPDropIn); empty, the kubelet picks one itself.
		args = append(args, "$"+NodeIPEnv)
	}
	if labels != "" {
		args = append(args, "--node-labels="+labels)
	}
	var binds strings.Builder
	for _, k := range sortedKeys(kernelDefaults) {
		fmt.Fprintf(&binds, "BindReadOnlyPaths=%s:/proc/sys/%s\n", sysctlFile(k), k)
	}
	// Units the kubelet waits for (containerd aside).
	waits := ""
	if len(opts.Preload) > 0 {
		waits = "Wants=" + PreloadUnit + "\nAfter=" + PreloadUnit + "\n"
	}
	if opts.CgroupV1Writable {
		waits += "Wants=" + CgroupCleanUnit + "\nAfter=" + CgroupCleanUnit + "\n"
	}
	return fmt.Sprintf(`# Written by kubeslot; it is rewritten on every configure.
[Unit]
Description=kubelet (kubeslot node)
# Wants=, not Requires=: a restart of containerd alone (a restart in place
# restarts it while the kubelet still serves) must not restart the kubelet.
Wants=%[1]s
After=%[1]s
%[5]s%[4]sStartLimitIntervalSec=0

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
`, ContainerdUnit, strings.Join(args, " \\\n  "), binds.String(), waits, servingCondition)
}

// nodeTargetDropIn enables containerd and the kubelet (both gated on the
// serving file) and, in a sandbox with writable v1 controllers, the remount,
// which runs at every boot of the machine, a warm standby's too: it writes
// no cgroup, so it needs no gate, and done at boot it is out of a switch's
// downtime.
func nodeTargetDropIn(opts Options) string {
	wants := ContainerdUnit + " " + KubeletUnit
	if opts.CgroupV1Writable {
		wants += " " + CgroupRWUnit
	}
	return "# Written by kubeslot; it is rewritten on every configure.\n[Unit]\nWants=" + wants + "\n"
}

// cgroupRWUnit remounts the v1 controllers nspawn mounts read-only in the
// node, before containerd (Options.CgroupV1Writable, the rig's).
const cgroupRWUnit = `# Written by kubeslot for a sandbox with writable cgroup v1 controllers; it is rewritten on every configure.
[Unit]
Description=Remount the cgroup v1 controllers read-write (kubeslot sandbox)
DefaultDependencies=no
Before=` + ContainerdUnit + `

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -euc 'for c in blkio cpu cpuacct cpuset devices freezer memory pids; do if [ -d /sys/fs/cgroup/$$c ]; then mount -o remount,bind,rw /sys/fs/cgroup/$$c; fi; done'
`

// cgroupCleanUnit runs before the kubelet with writable shared v1
// controllers (Options.CgroupV1Writable): the host's v1 controllers outlive
// a node, and empty cgroups of the last node's containers would keep the
// kubelet's cAdvisor retrying them for half a minute before the node turns
// Ready. It removes the empty ones (rmdir refuses the others) once per
// serving start of the machine, which a repave makes only once the old
// node's machine is gone. It is not ordered after containerd, whose start it
// runs beside: containerd makes no container cgroup before the kubelet asks.
// One find for all controllers, deleting as it goes: a find and an rmdir
// per controller took 0.07 s of the CPU containerd's start needed.
const cgroupCleanUnit = `# Written by kubeslot for a sandbox with writable cgroup v1 controllers; it is rewritten on every configure.
[Unit]
Description=Remove the last node's empty container cgroups (kubeslot sandbox)
` + servingCondition + `DefaultDependencies=no
Wants=` + CgroupRWUnit + `
After=` + CgroupRWUnit + `
Before=` + KubeletUnit + `

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=-/bin/sh -c 'set --; for c in blkio cpu cpuacct cpuset devices freezer memory pids; do [ -d /sys/fs/cgroup/$$c/k8s.io ] && set -- "$$@" /sys/fs/cgroup/$$c/k8s.io; done; [ $$# -eq 0 ] || find "$$@" -mindepth 1 -depth -type d -delete 2>/dev/null; exit 0'
`

// preloadScript imports the listed archives, skipping those an earlier
// start imported whose images are still there (scripts/preload.sh).
//
//go:embed scripts/preload.sh
var preloadScript []byte

// preloadUnit imports the listed image archives into containerd's k8s.io
// namespace (the CRI's) before the kubelet starts (preloadScript). The
// kubelet unit wants it, so a failure is in the journal without keeping the
// node from starting. Once every archive was imported (containerd's state is
// shared by the slots), the script leaves a marker named by the list
// (preloadComplete), and the unit before the kubelet is skipped by systemd
// while it exists: no process at all inside a repave's or restart's
// downtime, where the check had taken 0.05 s. The same script runs at
// every start of containerd (verify: wanted by containerd, not ordered
// before the kubelet, at idle priority), which a repave's runtime handover
// and a restart in place make while the old kubelet still serves, and wait
// for: out of the downtime and of the pods' path (beside the kubelet's
// start, even at idle priority, it made that start 0.05–0.1 s slower on 2
// CPUs). An image removed since (the kubelet's image garbage collection,
// which spares the sandbox image and images in use) is imported again
// there. A failed run removes the marker.
func preloadUnit(opts Options, verify bool) string {
	snapshotter := opts.Snapshotter
	if snapshotter == "" {
		snapshotter = "overlayfs"
	}
	complete := preloadComplete(opts.Preload, snapshotter)
	what, order, extra := "Import preloaded images into containerd", "Before="+KubeletUnit+"\n", ""
	cond := "ConditionPathExists=!" + complete + "\n"
	if verify {
		// Kept active until containerd stops (PartOf=): the kubelet's start
		// pulls in containerd's wants again, and must not run it again.
		what, order, extra = "Check the preloaded images in containerd", "After="+PreloadUnit+"\nPartOf="+ContainerdUnit+"\n",
			"CPUSchedulingPolicy=idle\nIOSchedulingClass=idle\n"
		cond = ""
	}
	return `# Written by kubeslot from [node] preload_images; it is rewritten on every configure.
[Unit]
Description=` + what + ` (kubeslot)
` + servingCondition + cond + `Requires=` + ContainerdUnit + `
After=` + ContainerdUnit + `
` + order + `
[Service]
Type=oneshot
Environment=CONTAINERD_SNAPSHOTTER=` + snapshotter + `
` + extra + `ExecStart=/bin/sh ` + PreloadScript + ` ` + PreloadList + ` ` + PreloadRecords + ` ` + complete + `
RemainAfterExit=yes
TimeoutStartSec=10min
`
}

// preloadComplete is the marker the preload script leaves in PreloadRecords
// once every archive of list has its record, named by the list and the
// snapshotter: another list or snapshotter runs the import first again.
func preloadComplete(list []string, snapshotter string) string {
	sum := sha256.Sum256([]byte(snapshotter + "\n" + strings.Join(list, "\n")))
	return PreloadRecords + "/complete-" + hex.EncodeToString(sum[:8])
}

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
		Token string `json:"token,omitempty"`
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
	if token == "" {
		return nil, errors.New("bootstrap kubeconfig: server, CA and token are required")
	}
	return kubeconfigFor(server, caPEM, token)
}

// kubeconfigFor is the bootstrap kubeconfig with token, or with a user of
// no credentials when token is "".
func kubeconfigFor(server string, caPEM []byte, token string) ([]byte, error) {
	if server == "" || len(caPEM) == 0 {
		return nil, errors.New("bootstrap kubeconfig: server and CA are required")
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
