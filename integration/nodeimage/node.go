package nodeimage

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Paths inside a node machine.
const (
	KubeletBinary       = "/usr/local/bin/kubelet"
	KubeletUnit         = "kubelet.service"
	ContainerdUnit      = "containerd.service"
	BootstrapKubeconfig = "/etc/kubernetes/bootstrap-kubelet.conf"
	// KubeletKubeconfig is written by the kubelet once its CSR is signed.
	KubeletKubeconfig = "/var/lib/kubelet/kubeconfig"
	kubeletConfig     = "/etc/kubernetes/kubelet-config.yaml"
	caFile            = "/etc/kubernetes/pki/ca.crt"
	sysctlDir         = "/etc/kubernetes/sysctl"
	containerdConfig  = "/etc/containerd/config.toml"
	cniConfig         = "/etc/cni/net.d/10-loopback.conflist"
)

// Node describes one kubelet node machine of the rig.
type Node struct {
	// Name is the machine name and the Kubernetes Node name.
	Name string
	// CAPEM is the cluster CA: the kubelet's x509 client CA.
	CAPEM []byte
	// BootstrapKubeconfig holds the apiserver address, the CA and a
	// bootstrap token (kube.ControlPlane.Kubeconfig).
	BootstrapKubeconfig []byte
	// KubeletPort and HealthzPort are free ports of 127.0.0.1: the node
	// shares the machine's network namespace.
	KubeletPort, HealthzPort int
}

// Nspawn is the node's /etc/systemd/nspawn/<name>.nspawn in its host.
//
//   - PrivateUsers=no: the default -U needs the tree chowned or idmapped
//     mounts, which this nesting refuses ("Operation not permitted").
//   - Capability=all: containerd and runc need the host's bounding set.
//   - Private=no, VirtualEthernet=no: the node uses its host's network
//     namespace, which for a SharedNetwork host is the machine's, so the
//     kubelet reaches the apiserver on 127.0.0.1. No interfaces are created.
//   - No Volatile=: the rootfs is a plain writable directory (the host's root
//     is already an overlay; a third overlay level is refused by the kernel).
func Nspawn() []byte {
	return []byte(`[Exec]
Boot=yes
PrivateUsers=no
Capability=all

[Network]
VirtualEthernet=no
Private=no
`)
}

// kernelDefaults are the sysctls the kubelet insists on (it writes them at
// start, or with protectKernelDefaults refuses to start). /proc/sys is
// read-only in a node and shared with the machine anyway, so the kubelet
// unit bind-mounts read-only files holding these values over them: the
// kubelet reads its values and writes nothing.
var kernelDefaults = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// WriteFiles writes n's node files into the node rootfs at dir (the
// kubelet binary is the caller's: KubeletBinary). All paths are resolved
// inside dir.
//
// The settings are the same on a unified (cgroup2-only) host and on a
// cgroup v1 hybrid host; what each layout needs:
//
//   - failCgroupV1: false: kubelet 1.37 refuses v1 by default. On a hybrid
//     host nspawn gives the node every v1 controller (read-only) and the
//     kubelet takes the v1 path; on a unified host it takes the v2 path and
//     the setting is inert.
//   - cgroupsPerQOS: false, enforceNodeAllocatable: []: on hybrid the v1
//     controllers are read-only, so kubepods cgroups cannot be created.
//     (On unified the node's cgroup2 subtree is delegated; QoS cgroups may
//     work there but were never tried.)
//   - cgroupDriver: cgroupfs and containerd SystemdCgroup=false on both:
//     containerd 1.6 lacks the CRI RuntimeConfig call, so the kubelet cannot
//     ask it and must be told; they must agree.
//
// TestNodeKubeletJoinsByTLSBootstrap passes with exactly these settings on
// both layouts (KUBESLOT_NODE_CGROUP_MODES="unified hybrid").
//
// Everything else is about not touching the machine the node shares its
// network namespace and kernel with: makeIPTablesUtilChains: false,
// protectKernelDefaults: false plus the sysctl binds, a loopback-only CNI,
// kubelet ports on 127.0.0.1, /dev/kmsg bound to /dev/null (the real one
// needs CAP_SYSLOG, which the host drops), and containerd's native
// snapshotter (its overlayfs snapshotter cannot stack on the overlay under
// the node).
func WriteFiles(dir string, n Node) error {
	if n.Name == "" || strings.ContainsAny(n.Name, "/ \n") {
		return fmt.Errorf("nodeimage: bad node name %q", n.Name)
	}
	if len(n.CAPEM) == 0 || len(n.BootstrapKubeconfig) == 0 || n.KubeletPort == 0 || n.HealthzPort == 0 {
		return fmt.Errorf("nodeimage: node %s: CAPEM, BootstrapKubeconfig, KubeletPort and HealthzPort are required", n.Name)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("nodeimage: %w", err)
	}
	defer root.Close()

	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return fmt.Errorf("nodeimage: machine id: %w", err)
	}
	files := []struct {
		path string
		data []byte
		mode os.FileMode
	}{
		// Own identity: an empty machine-id would make this a "first boot"
		// (preset-all, firstboot prompts).
		{"/etc/hostname", []byte(n.Name + "\n"), 0o644},
		{"/etc/machine-id", []byte(hex.EncodeToString(id) + "\n"), 0o444},
		{caFile, n.CAPEM, 0o644},
		{BootstrapKubeconfig, n.BootstrapKubeconfig, 0o600},
		{kubeletConfig, []byte(kubeletConfigYAML(n)), 0o644},
		{containerdConfig, []byte(containerdTOML), 0o644},
		{cniConfig, []byte(cniLoopback), 0o644},
		{"/etc/systemd/system/" + KubeletUnit, []byte(kubeletUnit(n)), 0o644},
	}
	for _, k := range sortedKeys(kernelDefaults) {
		files = append(files, struct {
			path string
			data []byte
			mode os.FileMode
		}{sysctlFile(k), []byte(kernelDefaults[k] + "\n"), 0o444})
	}
	for _, f := range files {
		rel := strings.TrimPrefix(f.path, "/")
		if err := root.MkdirAll(filepath.Dir(rel), 0o755); err != nil {
			return fmt.Errorf("nodeimage: node %s: %s: %w", n.Name, f.path, err)
		}
		_ = root.Remove(rel) // machine-id is read-only; rewrite, not update
		if err := root.WriteFile(rel, f.data, f.mode); err != nil {
			return fmt.Errorf("nodeimage: node %s: %s: %w", n.Name, f.path, err)
		}
		if err := root.Chmod(rel, f.mode); err != nil { // the umask narrowed it
			return fmt.Errorf("nodeimage: node %s: %s: %w", n.Name, f.path, err)
		}
	}
	return nil
}

func sysctlFile(key string) string {
	return sysctlDir + "/" + strings.ReplaceAll(key, "/", "_")
}

func kubeletConfigYAML(n Node) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# kubelet API on loopback only (the node shares the machine's network)
address: 127.0.0.1
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true, cacheTTL: 2m0s}
  x509: {clientCAFile: %s}
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
registerNode: true
rotateCertificates: true
# cgroups: see nodeimage.WriteFiles
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
# leave the shared kernel and network alone
protectKernelDefaults: false
makeIPTablesUtilChains: false
`, n.KubeletPort, n.HealthzPort, caFile)
}

func kubeletUnit(n Node) string {
	var binds strings.Builder
	for _, k := range sortedKeys(kernelDefaults) {
		fmt.Fprintf(&binds, "BindReadOnlyPaths=%s:/proc/sys/%s\n", sysctlFile(k), k)
	}
	return fmt.Sprintf(`[Unit]
Description=kubelet (kubeslot test rig node)
Requires=%[1]s
After=%[1]s

[Service]
ExecStart=%[2]s --config=%[3]s --bootstrap-kubeconfig=%[4]s --kubeconfig=%[5]s --cert-dir=/var/lib/kubelet/pki --root-dir=/var/lib/kubelet --hostname-override=%[6]s --node-ip=127.0.0.1
# The OOM watcher opens /dev/kmsg and fails hard without it; the real one
# needs CAP_SYSLOG (dmesg_restrict), which the rig host drops. /dev/null
# opens, seeks and reads EOF: the kubelet just gets no OOM events.
BindReadOnlyPaths=/dev/null:/dev/kmsg
%[7]sRestart=no
`, ContainerdUnit, KubeletBinary, kubeletConfig, BootstrapKubeconfig, KubeletKubeconfig, n.Name, binds.String())
}

// containerdTOML: the native snapshotter because the node's / sits on an
// overlay (the host's root) and the overlayfs snapshotter cannot use an
// overlay as its upper layer. The CRI stream server binds an ephemeral
// loopback port.
const containerdTOML = `version = 2
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
`

// cniLoopback is enough for the CRI to report NetworkReady (so the Node
// goes Ready) while creating no interface, route or firewall rule.
const cniLoopback = `{"cniVersion": "0.4.0", "name": "rig-loopback", "plugins": [{"type": "loopback"}]}
`

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
