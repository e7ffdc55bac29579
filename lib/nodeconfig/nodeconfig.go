// Package nodeconfig renders the node profile: the files that make a node
// rootfs a worker node of the configured cluster (the kubelet's
// configuration, kubeslot's base with the user's override laid over it by
// lib/nodeconfig/kubelet, and the kubelet's unit, containerd's
// configuration, registry mirrors and image preloads, the CNI network of
// [node.cni], the bootstrap kubeconfig and CA, and the sysctl files the
// kubelet unit binds read-only), and the
// host's cgroup profile. It knows the node side only; where the node runs
// (an nspawn machine) is the business of the isolation backends, which
// import it, and lib/bootstrap's preflight reads the cgroup profile.
// Imported by the isolation backends, lib/bootstrap and lib/nodeidentity
// (the node's credential paths) only.
//
// Options' zero value is the production profile of a real host; each
// compromise a test machine needs is a named field set only from the sandbox
// record (lib/sandbox). The rig proves both: TestPodsOnRig runs pods on the
// profile with the compromises this machine forces, and
// TestNspawnNodeFilesMatchRig keeps integration/nodeimage (the rig's own
// reference node, which production code must not import) in step.
package nodeconfig

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"sort"
	"strings"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/units"
)

// Paths inside the node.
const (
	KubeletBinary       = "/usr/local/bin/kubelet"
	KubeletUnit         = "kubelet.service"
	ContainerdUnit      = "containerd.service"
	KubeletUnitPath     = "/etc/systemd/system/" + KubeletUnit
	ContainerdUnitPath  = "/etc/systemd/system/" + ContainerdUnit
	KubeletConfig       = "/etc/kubernetes/kubelet-config.yaml"
	BootstrapKubeconfig = "/etc/kubernetes/bootstrap-kubelet.conf"
	// KubeletKubeconfig is written by the kubelet itself: after TLS
	// bootstrap, or (certificate rotation on) at every start, pointing at
	// the client certificate in CertDir. A new slot whose CertDir holds the
	// kept identity therefore needs no bootstrap token.
	KubeletKubeconfig = "/var/lib/kubelet/kubeconfig"
	// CertDir is where the node identity directory of the host is bound.
	CertDir          = "/var/lib/kubelet/pki"
	RootDir          = "/var/lib/kubelet"
	CAFile           = "/etc/kubernetes/pki/ca.crt"
	SysctlDir        = "/etc/kubernetes/sysctl"
	ContainerdConfig = "/etc/containerd/config.toml"
	// ContainerdSocket is containerd's API socket in the node, the CRI
	// endpoint of the kubelet (and of lib/cri, from the host).
	ContainerdSocket = "/run/containerd/containerd.sock"
	CNIConfig        = CNIConfDir + "/10-loopback.conflist"
	CNIBinDir        = "/usr/lib/cni"
	// ContainerdBinary is where a containerd artifact's binaries go
	// (the release archive's bin/ unpacked into /usr/local).
	ContainerdBinary = "/usr/local/bin/containerd"
	RuncBinary       = "/usr/local/sbin/runc"
)

// Defaults of Options.
const (
	DefaultKubeletPort = 10250
	DefaultHealthzPort = 10248
)

// Paths of the node's state that lives on the host, bound into whichever
// slot runs (the backend binds them): images survive a repave or restart,
// and a cluster CNI's config and plugins stay where its DaemonSet put them.
const (
	ContainerdRoot = "/var/lib/containerd"
	CNIConfDir     = "/etc/cni/net.d"
	// ClusterCNIBinDir is where a cluster CNI DaemonSet installs its
	// plugins; the rootfs's own (CNIBinDir) are copied there at start, so
	// loopback and portmap are there before the DaemonSet runs.
	ClusterCNIBinDir = "/opt/cni/bin"
	// CNIBridgeName is the bridge link of [node.cni] mode "bridge", in the
	// host's network namespace (journalled; reset removes it).
	CNIBridgeName = "cni0"
	// CNITemplate is containerd's template for the bridge network: the
	// CRI plugin fills in the Node's podCIDR once the kubelet knows it.
	CNITemplate = "/etc/containerd/cni-bridge.template"
	// RegistryConfigDir holds one <registry host>/hosts.toml per mirrored
	// registry (containerd's config_path).
	RegistryConfigDir = "/etc/containerd/certs.d"
	// ContainerdDropIn makes containerd pull in the node units it needs.
	ContainerdDropIn = "/etc/systemd/system/" + ContainerdUnit + ".d/kubeslot.conf"
	CgroupRWUnit     = "kubeslot-cgroup-v1-rw.service"
	CgroupRWUnitPath = "/etc/systemd/system/" + CgroupRWUnit
	// CgroupCleanUnit removes the last node's empty container cgroups
	// before the kubelet (the same sandbox option).
	CgroupCleanUnit     = "kubeslot-cgroup-v1-clean.service"
	CgroupCleanUnitPath = "/etc/systemd/system/" + CgroupCleanUnit
	CNISeedUnit         = "kubeslot-cni-seed.service"
	CNISeedUnitPath     = "/etc/systemd/system/" + CNISeedUnit
	// CacheMount is where the host's artifact cache is bound read-only
	// when images are preloaded from it.
	CacheMount      = "/var/lib/kubeslot/cache"
	PreloadList     = "/etc/kubeslot/preload.list"
	PreloadScript   = "/etc/kubeslot/preload.sh"
	PreloadUnit     = "kubeslot-preload.service"
	PreloadUnitPath = "/etc/systemd/system/" + PreloadUnit
	// PreloadVerifyUnit runs the preload beside the kubelet's start, at
	// idle priority, for a preload skipped once every archive was imported
	// (preloadUnit).
	PreloadVerifyUnit     = "kubeslot-preload-verify.service"
	PreloadVerifyUnitPath = "/etc/systemd/system/" + PreloadVerifyUnit
	// PreloadRecords is where the preload records what each archive's
	// import brought, in containerd's state (shared by the slots, removed
	// with it): a later start skips an archive whose images are all there.
	PreloadRecords = ContainerdRoot + "/kubeslot-preloaded"
	// ServingFile marks the slot whose node serves. containerd, the
	// kubelet and the units that feed them start only where it exists
	// (ConditionPathExists=), so a repave can boot the target's machine
	// while the old node still serves (a warm standby): two containerds on
	// the one state directory (ContainerdRoot) would wait on each other's
	// lock, and two kubelets would fight over the Node. The backend writes
	// it just before it starts them (lib/isolation/nspawn, Serve); it stays
	// in the rootfs, so the serving slot's node starts them at every boot.
	ServingFile = "/etc/kubeslot/serving"
	// NodeTargetDropIn enables containerd and the kubelet (Wants= of
	// multi-user.target, as `systemctl enable` would link them) as a plain
	// file rendered with the others: starting them needs no daemon-reload
	// in the node, which `systemctl enable --now` costs inside the downtime.
	NodeTargetDropIn = "/etc/systemd/system/multi-user.target.d/kubeslot.conf"
)

// NodeIPEnv is the kubelet unit's environment variable holding
// "--node-ip=<address>" when no node IP is pinned (Options.NodeIP): the
// nspawn backend's pre-start hook writes it into NodeIPDropIn before every
// node start, from the host's address at that moment.
const (
	NodeIPEnv    = "KUBESLOT_NODE_IP_ARG"
	NodeIPDropIn = "/etc/systemd/system/" + KubeletUnit + ".d/10-kubeslot-node-ip.conf"
)

// servingCondition gates a node unit on ServingFile.
const servingCondition = "ConditionPathExists=" + ServingFile + "\n"

// Cgroups is the cgroup profile of a node: what the host's cgroups let the
// kubelet do. The backend detects it on the host (DetectCgroups).
type Cgroups string

const (
	// CgroupsSystemd is the production profile, on a cgroup v2 host that
	// delegates the cpu, memory and pids controllers: the systemd cgroup
	// driver (kubelet and containerd), QoS cgroups and node allocatable
	// enforced for pods.
	CgroupsSystemd Cgroups = "systemd"
	// CgroupsNoControllers is the fallback on a host that cannot give the
	// node those controllers (cgroup v1 or hybrid, where nspawn mounts the
	// v1 controllers read-only, or v2 without them delegated): the cgroupfs
	// driver, no QoS cgroups, nothing enforced. Pods run without resource
	// isolation from each other; preflight says so.
	CgroupsNoControllers Cgroups = "cgroupfs-no-qos"
)

// Options are the node settings that do not come from the configuration
// file. The zero value is the production default.
// NVIDIARuntimeBinary is where the NVIDIA container toolkit's packages
// install its runtime (a runc wrapper that adds the GPUs and driver files
// a container asks for through NVIDIA_VISIBLE_DEVICES).
const NVIDIARuntimeBinary = "/usr/bin/nvidia-container-runtime"

type Options struct {
	// KubeletPort and HealthzPort: 0 means the defaults.
	KubeletPort, HealthzPort int
	// NodeIP is the kubelet's --node-ip and the address its API listens
	// on; "" lets the kubelet choose the address and listen on all.
	NodeIP string
	// Cgroups is the host's cgroup profile; "" means CgroupsSystemd.
	Cgroups Cgroups
	// Preload are the node paths of the image archives to import into
	// containerd before the kubelet starts ([node] preload_images, from the
	// cache bound at CacheMount).
	Preload []string
	// OwnContainerd writes a containerd unit for ContainerdBinary (the
	// configuration installs a containerd artifact) instead of using the
	// rootfs's own.
	OwnContainerd bool
	// NVIDIARuntime is the node path of the NVIDIA container toolkit's
	// runtime (NVIDIARuntimeBinary) when [node.devices] gpus is "nvidia"
	// and the node image has it: containerd then runs pods through it by
	// default, so a container the device plugin gives a GPU gets the
	// driver's libraries too. "" leaves runc alone.
	NVIDIARuntime string

	// The test rig's compromises, each from the sandbox record
	// (lib/sandbox); a production host sets none of them.

	// LoopbackCNI writes a loopback-only network instead of [node.cni]:
	// the node shares the test machine's network namespace, where no CNI
	// may create links, routes or firewall rules.
	LoopbackCNI bool
	// Snapshotter replaces containerd's overlayfs snapshotter ("native"):
	// the rig's host disk is itself an overlayfs, which overlayfs cannot
	// stack on.
	Snapshotter string
	// RestrictOOMScoreAdj keeps containers' oom_score_adj at or above
	// containerd's own and sets the kubelet's to 0: the rig's machine
	// withholds CAP_SYS_RESOURCE, so the sandbox's -998 fails, and the
	// kubelet's -999 fails after two tries 100 ms apart.
	RestrictOOMScoreAdj bool
	// CgroupV1Writable remounts the node's cgroup v1 controllers read-write
	// before containerd starts (nspawn mounts them read-only): the rig's
	// hosts have writable v1 controllers of their own, since this machine
	// binds every controller to v1.
	CgroupV1Writable bool
}

// CgroupProfile is Cgroups with the default applied.
func (o Options) CgroupProfile() Cgroups {
	if o.Cgroups == "" {
		return CgroupsSystemd
	}
	return o.Cgroups
}

// Ports returns the kubelet and healthz ports with defaults applied.
func (o Options) Ports() (kubelet, healthz int) {
	kubelet, healthz = o.KubeletPort, o.HealthzPort
	if kubelet == 0 {
		kubelet = DefaultKubeletPort
	}
	if healthz == 0 {
		healthz = DefaultHealthzPort
	}
	return kubelet, healthz
}

func (o Options) check() error {
	k, h := o.Ports()
	for _, p := range []struct {
		name string
		v    int
	}{{"kubelet port", k}, {"healthz port", h}} {
		if p.v < 1 || p.v > 65535 {
			return fmt.Errorf("node options: %s %d: want 1-65535", p.name, p.v)
		}
	}
	if k == h {
		return fmt.Errorf("node options: kubelet and healthz port are both %d", k)
	}
	if o.NodeIP != "" && net.ParseIP(o.NodeIP) == nil {
		return fmt.Errorf("node options: node IP %q is not an IP address", o.NodeIP)
	}
	if p := o.CgroupProfile(); p != CgroupsSystemd && p != CgroupsNoControllers {
		return fmt.Errorf("node options: cgroup profile %q: want %s or %s", p, CgroupsSystemd, CgroupsNoControllers)
	}
	for _, p := range o.Preload {
		if !strings.HasPrefix(p, CacheMount+"/") || !unitSafe(p) {
			return fmt.Errorf("node options: preload archive %q: want a path of plain characters under %s", p, CacheMount)
		}
	}
	if o.Snapshotter != "" && o.Snapshotter != "native" && o.Snapshotter != "overlayfs" {
		return fmt.Errorf("node options: snapshotter %q: want native or overlayfs", o.Snapshotter)
	}
	return nil
}

// File is one rendered file: an absolute path inside the node, its content
// and mode.
type File struct {
	Path string
	Data []byte
	Mode fs.FileMode
}

// Credentials are what the node joins the cluster with. They are secret
// (the bootstrap kubeconfig holds the token): never log them.
type Credentials struct {
	CAPEM               []byte
	BootstrapKubeconfig []byte
}

// maxInputFile bounds the host files read here (CA, kubeconfig): a few KiB
// each; reading a device by mistake must fail, not exhaust memory.
const maxInputFile = 1 << 20

// LoadCA reads the cluster's CA from the configuration: inline, or
// cluster.ca_file read through root.
func LoadCA(root *hostroot.Root, cfg *config.Config) ([]byte, error) {
	cl := cfg.Cluster
	var ca []byte
	switch {
	case cl.CAPEM != "":
		ca = []byte(cl.CAPEM)
	case cl.CAFile != "":
		b, err := readHostFile(root, cl.CAFile)
		if err != nil {
			return nil, fmt.Errorf("cluster.ca_file: %w", err)
		}
		ca = b
	default:
		return nil, errors.New("cluster: neither ca_file nor ca_pem is set")
	}
	if err := checkCA(ca); err != nil {
		return nil, fmt.Errorf("cluster CA: %w", err)
	}
	return ca, nil
}

// ErrNoJoinCredential (wrapped) is LoadCredentials' error for a
// configuration with neither a join token nor a join kubeconfig.
var ErrNoJoinCredential = errors.New("no join credential")

// LoadCredentials builds the node's join credentials from the
// configuration: the CA (LoadCA) and the bootstrap kubeconfig (written from
// the server, the CA and cluster.bootstrap_token, or cluster.kubeconfig read
// through root as it is). A node that keeps its identity needs no token:
// nodeidentity.SlotCredentials decides which one a slot gets.
func LoadCredentials(root *hostroot.Root, cfg *config.Config) (*Credentials, error) {
	ca, err := LoadCA(root, cfg)
	if err != nil {
		return nil, err
	}
	cl := cfg.Cluster
	c := &Credentials{CAPEM: ca}
	switch {
	case cl.BootstrapToken != "":
		kc, err := BootstrapKubeconfigFor(cl.Server, ca, cl.BootstrapToken.Reveal())
		if err != nil {
			return nil, err
		}
		c.BootstrapKubeconfig = kc
	case cl.Kubeconfig != "":
		b, err := readHostFile(root, cl.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("cluster.kubeconfig: %w", err)
		}
		if len(b) == 0 {
			return nil, fmt.Errorf("cluster.kubeconfig %s: empty file", cl.Kubeconfig)
		}
		c.BootstrapKubeconfig = b
	default:
		// The bootstrap removes the token once the node has its identity,
		// so this is a host whose identity is gone (or that never joined).
		return nil, fmt.Errorf("cluster.bootstrap_token: %w: the node identity (%s/%s) is missing and the configuration "+
			"has no join token (it is removed after the first join): create a new bootstrap token (e.g. kubeadm token "+
			"create --ttl 1h) and set it as bootstrap_token under [cluster] in %s, then run the bootstrap again",
			ErrNoJoinCredential, root.HostPath(hostroot.IdentityDir), IdentityPairName, units.ConfigPath)
	}
	return c, nil
}

// IdentityPairName is the kubelet's link to its current client pair in the
// identity directory (nodeidentity.CurrentPair, named here for messages).
const IdentityPairName = "kubelet-client-current.pem"

// IdentityKubeconfig are the credentials of a slot whose node keeps its
// identity: the CA, and a bootstrap kubeconfig with the server and CA but
// no user. The kubelet needs the file (it builds its own kubeconfig from
// it, pointing at the client certificate in CertDir) but sends no
// credential from it while that certificate is valid; with an expired one
// its request for a new one is refused, as it should be.
func IdentityKubeconfig(root *hostroot.Root, cfg *config.Config) (*Credentials, error) {
	ca, err := LoadCA(root, cfg)
	if err != nil {
		return nil, err
	}
	kc, err := kubeconfigFor(cfg.Cluster.Server, ca, "")
	if err != nil {
		return nil, err
	}
	return &Credentials{CAPEM: ca, BootstrapKubeconfig: kc}, nil
}

func readHostFile(root *hostroot.Root, hostPath string) ([]byte, error) {
	local, err := root.Resolve(hostPath)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(local)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxInputFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", local, err)
	}
	if len(b) > maxInputFile {
		return nil, fmt.Errorf("%s: larger than %d bytes; is this the right file?", local, maxInputFile)
	}
	return b, nil
}

// checkCA wants at least one PEM certificate, and every CERTIFICATE block
// to parse: a damaged CA would otherwise surface as an opaque TLS error in
// the kubelet's log.
func checkCA(b []byte) error {
	n := 0
	for rest := b; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			return fmt.Errorf("certificate %d: %w", n+1, err)
		}
		n++
	}
	if n == 0 {
		return errors.New("no PEM CERTIFICATE block")
	}
	return nil
}

// kernelDefaults are the sysctls the kubelet insists on (it writes them at
// start, or with protectKernelDefaults refuses to start). /proc/sys is
// read-only in a node, so the kubelet unit binds read-only files holding
// these values over them: the kubelet reads its values and writes nothing.
// The kernel's real values stay the host's own: host preparation does not
// set these (which is why protectKernelDefaults stays false: the kubelet
// would check the bound files, not the kernel).
var kernelDefaults = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

func sysctlFile(key string) string {
	b := []byte(key)
	for i, c := range b {
		if c == '/' {
			b[i] = '_'
		}
	}
	return SysctlDir + "/" + string(b)
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
