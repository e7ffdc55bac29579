package nodeconfig

import "fmt"

// The node side of NVIDIA GPUs (Options.NVIDIARuntime): the host's driver
// files are bound in by the isolation backend; these make the NVIDIA
// container toolkit in the node image find and use them.

// NVIDIALdconfigUnit rebuilds the node's dynamic linker cache before
// containerd starts: the toolkit finds the driver's libraries through
// /etc/ld.so.cache, which the image was built without.
const (
	NVIDIALdconfigUnit     = "kubeslot-nvidia-ldconfig.service"
	NVIDIALdconfigUnitPath = "/etc/systemd/system/" + NVIDIALdconfigUnit
)

// nvidiaLdconfigUnit: -X leaves the soname links alone (they are the host's
// files, bound over their paths: ldconfig could not replace them).
const nvidiaLdconfigUnit = `# Written by kubeslot for a node with NVIDIA GPUs; it is rewritten on every configure.
[Unit]
Description=Add the host's NVIDIA driver libraries to the dynamic linker cache (kubeslot)
` + servingCondition + `Before=` + ContainerdUnit + `

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/sbin/ldconfig -X
`

// nvidiaRuntime is containerd's runtime entry for the NVIDIA container
// toolkit's runtime, with the cgroup driver of the profile.
func nvidiaRuntime(binary string, systemdCgroup bool) string {
	return fmt.Sprintf(`  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
      BinaryName = %q
      SystemdCgroup = %t
`, binary, systemdCgroup)
}
