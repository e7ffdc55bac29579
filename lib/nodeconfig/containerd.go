package nodeconfig

import (
	"fmt"
	"strings"

	"github.com/kubeslot/kubeslot/lib/config"
)

// containerd's configuration and unit, its registry mirrors, and the pod
// network's files (the CNI configurations of each mode and the seed unit).

// cniLoopbackMode is the CNI mode of Options.LoopbackCNI (not a [node.cni]
// mode: the rig's compromise).
const cniLoopbackMode = "loopback"

func cniMode(cfg *config.Config, opts Options) string {
	if opts.LoopbackCNI {
		return cniLoopbackMode
	}
	return cfg.Node.CNI.CNIMode()
}

// containerdTOML: the root on the host disk (bound in by the backend), state
// in /run, the CRI stream server on an ephemeral loopback port (the kubelet
// proxies streams to it), the cgroup driver of the profile, the sandbox
// image and registry mirrors of [node], and the CNI directories of the mode.
func containerdTOML(cfg *config.Config, opts Options) string {
	snapshotter := opts.Snapshotter
	if snapshotter == "" {
		snapshotter = "overlayfs"
	}
	// The NVIDIA device plugin expects the toolkit's runtime as the
	// default (as its docs set it up), not behind a RuntimeClass.
	defaultRuntime, nvidia := "", ""
	if opts.NVIDIARuntime != "" {
		defaultRuntime = "\n    default_runtime_name = \"nvidia\""
		nvidia = nvidiaRuntime(opts.NVIDIARuntime, opts.CgroupProfile() == CgroupsSystemd)
	}
	binDir, template := CNIBinDir, ""
	switch cniMode(cfg, opts) {
	case config.CNICluster:
		binDir = ClusterCNIBinDir
	case config.CNIBridge:
		template = fmt.Sprintf("\n    conf_template = %q", CNITemplate)
	}
	return fmt.Sprintf(`# Written by kubeslot; it is rewritten on every configure.
version = 2
root = %q
state = "/run/containerd"

[grpc]
  address = "`+ContainerdSocket+`"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  restrict_oom_score_adj = %t
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = %q%s
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q%s
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = %q
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = %t
%s`, ContainerdRoot, cfg.Node.Sandbox(), opts.RestrictOOMScoreAdj, snapshotter, defaultRuntime, binDir, CNIConfDir, template,
		RegistryConfigDir, opts.CgroupProfile() == CgroupsSystemd, nvidia)
}

// cniLoopback lets the CRI report NetworkReady (so the Node goes Ready)
// while creating no interface, route or firewall rule: pods get only lo.
// Only the test rig writes it (Options.LoopbackCNI).
const cniLoopback = `{"cniVersion": "0.4.0", "name": "kubeslot-loopback", "plugins": [{"type": "loopback"}]}
`

// cniBridgeTemplate is containerd's conf_template for [node.cni] mode
// "bridge": the CRI plugin renders it into the CNI config directory with
// the Node's podCIDR when the kubelet passes it on. Pods get a veth on the
// cni0 bridge of the host's network namespace, the bridge is their gateway,
// traffic leaving the node is masqueraded, and hostPort works (portmap).
// No loopback entry: the CRI plugin brings every sandbox's lo up with a
// network of its own, so one here ran the plugin twice per sandbox, in the
// path of every pod's start and stop.
const cniBridgeTemplate = `{
  "cniVersion": "0.4.0",
  "name": "kubeslot-bridge",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "` + CNIBridgeName + `",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "{{.PodCIDR}}"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`

// cniSeedUnit copies the rootfs's CNI plugins into the host-kept plugin
// directory of [node.cni] mode "cluster" before containerd starts, without
// replacing what the cluster's CNI DaemonSet installed there.
const cniSeedUnit = `# Written by kubeslot; it is rewritten on every configure.
[Unit]
Description=Seed the CNI plugin directory (kubeslot)
` + servingCondition + `Before=` + ContainerdUnit + `
DefaultDependencies=no
After=local-fs.target

[Service]
Type=oneshot
ExecStart=/bin/sh -c 'for f in ` + CNIBinDir + `/*; do [ -e "$$f" ] || continue; t=` + ClusterCNIBinDir + `/$${f##*/}; [ -e "$$t" ] || cp -p "$$f" "$$t"; done'
RemainAfterExit=yes
`

// registryHosts renders one hosts.toml per mirrored registry: the mirrors
// in order, for pull and resolve, then the registry itself (server).
func registryHosts(mirrors map[string][]string) []File {
	var files []File
	for _, host := range config.SortedKeys(mirrors) {
		server := "https://" + host
		if host == "docker.io" {
			server = "https://registry-1.docker.io"
		}
		var b strings.Builder
		fmt.Fprintf(&b, "# Written by kubeslot from [node.registry_mirrors]; it is rewritten on every configure.\nserver = %q\n", server)
		for _, m := range mirrors[host] {
			fmt.Fprintf(&b, "\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", m)
		}
		files = append(files, File{RegistryConfigDir + "/" + host + "/hosts.toml", []byte(b.String()), 0o644})
	}
	return files
}

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
