package config

// Example returns a complete, commented configuration that Parse accepts.
// The values are placeholders (documentation addresses, a well-known fake
// token, made-up digests): the operator replaces them. `kubeslot config
// example` prints it.
func Example() []byte { return []byte(example) }

const example = `# kubeslot bootstrap configuration (TOML).
# Unknown keys are errors, so a typo is caught rather than ignored.

[machine]
# Name of the node's systemd-nspawn machine on this host: a DNS-1123 label
# (lowercase letters, digits, '-'; at most 63 characters). Leave it out and
# each host takes its own name (the first label of its hostname, lowercased),
# so one file serves a fleet; set it where hostnames change.
name = "worker-1"
# Kubernetes node name; defaults to name. May be dotted (an FQDN).
# node_name = "worker-1.example.internal"

[cluster]
# The API server to join: an https URL.
server = "https://203.0.113.10:6443"
# The cluster CA, exactly one of: a path on this host ...
ca_file = "/etc/kubeslot/cluster-ca.crt"
# ... or the PEM itself:
# ca_pem = """
# -----BEGIN CERTIFICATE-----
# ...
# -----END CERTIFICATE-----
# """
# How to join, one of: a short-lived bootstrap token ("kubeadm token create
# --ttl 1h"; never logged; removed from here once the node joined) ...
bootstrap_token = "abcdef.0123456789abcdef"
# ... or a kubeconfig with join credentials:
# kubeconfig = "/etc/kubeslot/bootstrap.kubeconfig"

[kubernetes]
# Kubelet version: MAJOR.MINOR.PATCH ("v1.37.2" is accepted too).
version = "1.37.2"
# Cluster DNS service addresses and domain handed to the kubelet.
cluster_dns = ["10.96.0.10"]
cluster_domain = "cluster.local"
# Taints the node registers with: "key=value:Effect" or "key:Effect", the
# effect one of NoSchedule, PreferNoSchedule, NoExecute.
taints = ["dedicated=batch:NoSchedule"]

# Labels the node registers with (quote keys that contain '.' or '/').
[kubernetes.labels]
"kubeslot.dev/pool" = "edge"
"topology.kubernetes.io/zone" = "zone-a"

[rootfs]
# The node root filesystem: a tarball (an http(s) URL or an absolute path)
# and its sha256 (64 hex digits; these are placeholders). Or an OCI image,
# source = "oci://registry.example:5000/node/bookworm" (a tag may follow but
# does not count), and then sha256 is the image MANIFEST digest (an index's
# digest picks this host's architecture), as "crane digest" prints it: the
# image is pulled by that digest, anonymously, and flattened.
source = "https://images.example.com/kubeslot/node-rootfs-1.37.2.tar.zst"
sha256 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

# Binaries installed into the node rootfs, each a url (http(s) or an absolute
# path) and its sha256. The kubelet is required; containerd, runc and the
# CNI plugins may be left out when the rootfs already has them.
# Where the kubelet of kubernetes.version comes from: either a release mirror
# laid out like the upstream downloads (<mirror>/v<version>/bin/linux/<arch>/
# kubelet, checked against the kubelet.sha256 published beside it), so that a
# Machine's spec.node.kubernetesVersion alone picks the kubelet; or one file
# named in [artifacts.kubelet], which then wins. The mirror must be https or
# an absolute local path: over plain http the network would pick both the
# kubelet, which runs as root, and its digest.
# [kubernetes.release]
# mirror = "https://dl.k8s.io/release"
# CA of an https mirror whose certificate the system's roots do not sign
# (ca_file or ca_pem, at most one).
# ca_file = "/etc/kubeslot/mirror-ca.crt"
# ca_pem = ""
# The kubelet's digest per Kubernetes version, held by you rather than the
# mirror. The mirror's kubelet.sha256 guards against a corrupted download,
# not against a hostile mirror or network; a pin does. A pinned version is
# checked against the pin, and the mirror's digest, when it has one, must
# agree with it. Pin the releases a Machine may move this node to as well.
# [kubernetes.release.kubelet_sha256]
# "1.37.2" = "2222222222222222222222222222222222222222222222222222222222222222"

[artifacts.kubelet]
url = "https://dl.k8s.io/release/v1.37.2/bin/linux/amd64/kubelet"
sha256 = "1111111111111111111111111111111111111111111111111111111111111111"

[artifacts.containerd]
url = "https://artifacts.example.com/containerd/containerd-linux-amd64.tar.gz"
sha256 = "2222222222222222222222222222222222222222222222222222222222222222"

# [artifacts.runc]
# url = "/srv/kubeslot/runc.amd64"
# sha256 = "3333333333333333333333333333333333333333333333333333333333333333"

[artifacts.cni_plugins]
url = "https://artifacts.example.com/cni/cni-plugins-linux-amd64.tgz"
sha256 = "4444444444444444444444444444444444444444444444444444444444444444"

[isolation]
# How the node runs: "nspawn" (a systemd-nspawn machine) is the only mode.
mode = "nspawn"
# The two A/B slots: an upgrade installs into the idle one.
slots = ["a", "b"]

[timeouts]
# Bounds on the stages' waits: a number with a unit, at most 24h. A repave's worst case, lock +
# download + 2 x (stop + node_ready), must fit in 28m (its unit's TimeoutStartSec is 30min).
download = "10m"   # fetching the rootfs and artifacts, all together
node_ready = "5m"  # the node turning Ready after it starts
lock = "30s"       # waiting for the installation lock
stop = "90s"       # stopping the node machine

[host]
# Whether bootstrap may install missing host packages (apt-get or dnf; never on
# image-based hosts such as Fedora CoreOS and Flatcar).
install_packages = false

# The node's pods: network, images and reservations. Every key is optional.
[node]
# The pod sandbox ("pause") image containerd runs for every pod. A host that
# cannot reach registry.k8s.io needs a mirror below, or an image of its own.
# sandbox_image = "registry.k8s.io/pause:3.10.1"
# Images imported into the node's containerd before the kubelet starts, for
# hosts without registry access: an image archive (docker save, or an OCI
# layout tarball) by URL or absolute path with its sha256, or an image
# "oci://<registry>/<repository>:<tag>" with its manifest digest.
# preload_images = [
#   {source = "https://mirror.example.internal/images/pause-3.10.1.tar", sha256 = "5555555555555555555555555555555555555555555555555555555555555555"},
# ]

[node.cni]
# "cluster" (default): the cluster's CNI DaemonSet (Calico, Cilium, Flannel,
# ...) installs the network; kubeslot keeps /etc/cni/net.d and /opt/cni/bin on
# the host, so they survive repaves. "bridge": kubeslot writes a bridge
# network for the Node's spec.podCIDR (single-node and edge clusters; the
# controller manager must allocate node CIDRs).
mode = "cluster"

# Registry mirrors (containerd hosts.toml): tried in order before the registry.
[node.registry_mirrors]
# "docker.io" = ["https://mirror.example.internal"]
# "registry.k8s.io" = ["https://mirror.example.internal"]

# Resources the kubelet keeps from pods (cpu, memory, ephemeral-storage, pid).
[node.kube_reserved]
# cpu = "100m"
# memory = "256Mi"

[node.system_reserved]
# cpu = "100m"
# memory = "256Mi"

# Host devices passed into the node (/dev/kvm always is, when present). A
# Machine's spec.node.devices replaces gpus and paths; a change repaves.
[node.devices]
# "nvidia": bind the host's NVIDIA device nodes and driver libraries and
# binaries (read-only) into the node; configure fails, naming what is
# missing, when the host has no driver loaded. "none" (default): no GPUs.
# gpus = "nvidia"
# Further device nodes (char or block) under /dev, bound and allowed
# read-write; each must exist on the host.
# paths = ["/dev/fuse"]
# The device paths a Machine's spec.node.devices.paths may select from
# (path.Match patterns: '*' and '?' within one path element, '[...]'
# classes). Empty: a Machine may pass none, and may ask for the NVIDIA
# GPUs only when gpus above is "nvidia" or this matches /dev/nvidiactl.
# The host's memory and ports
# (/dev/mem, /dev/kmem, /dev/port), block devices and raw disk nodes pass,
# from the spec or from paths above, only when listed here exactly, never
# through a wildcard.
# allowed = ["/dev/ttyUSB*", "/dev/net/tun", "/dev/fuse"]
# Where the NVIDIA driver's libraries are (these are the defaults).
# nvidia_driver_dirs = ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"]

# The kubelet's own settings, laid over kubeslot's key by key: keys of its
# configuration file (KubeletConfiguration, kubelet.config.k8s.io/v1beta1) by
# their names there. The keys kubeslot owns are refused (the kubelet API's
# security, its ports, the cgroup profile, and what [kubernetes] and [node]
# set; README, "Kubelet configuration"). A Machine's spec.node.kubelet.config
# replaces this table; a change repaves.
[node.kubelet]
# config = {maxPods = 150, shutdownGracePeriod = "30s"}
# or as a table of its own:
# [node.kubelet.config]
# maxPods = 150
# evictionHard = {"memory.available" = "200Mi", "nodefs.available" = "10%"}

# The watcher's Prometheus metrics (off unless listen is set; read when the
# watcher starts: systemctl restart kubeslot-watcher after a change). Not a
# node setting: changing it never repaves the node.
[metrics]
# host:port to serve /metrics on; a loopback address unless allow_remote.
# listen = "127.0.0.1:9469"
# The endpoint is plain HTTP without authentication: allow an address other
# than loopback (e.g. "0.0.0.0:9469") only on a network you trust.
# allow_remote = false

# What the upgrader accepts. Not a node setting either; read at each upgrade.
[upgrade]
# minisign public keys (the RW... line of minisign.pub): with any, an
# AgentUpgrade's bundle must be signed by one of them (<bundle URL>.minisig,
# made by minisign -S -m <bundle>), checked before anything is unpacked.
# trusted_keys = ["RWS5LMcFX+hKAW9/FLgWCFfGzuLsOtAGj9pLDhzUMY68MGvnv7SEE4Wg"]
`
