// Package rigenv is the sandbox record a rig host's bootstrap gets: the
// environment that names what this shared test machine forbids (DESIGN.md,
// "Test rig"), in one place for the rig tests and `make demo`. Imported only
// by integration/ (tests and the demo); production code never sets these.
package rigenv

import (
	"fmt"
	"net/netip"

	"github.com/kubeslot/kubeslot/lib/bootstrap"
)

// Loopback is the environment of a host that shares the machine's network:
// free kubelet ports and the loopback node IP (the machine's own ports and
// addresses are not the rig's), a read-only /proc/sys/net, host preparation
// limited to packages (modules, sysctls and swap are the machine's), a
// loopback-only pod network, the native snapshotter (the host's disk is an
// overlayfs), oom scores the kubelet may set without CAP_SYS_RESOURCE, and
// no registry check of the sandbox image (no public registry from here).
func Loopback(kubeletPort, healthzPort int) []string {
	return []string{
		bootstrap.EnvKubeletPort + "=" + fmt.Sprint(kubeletPort),
		bootstrap.EnvHealthzPort + "=" + fmt.Sprint(healthzPort),
		bootstrap.EnvNodeIP + "=127.0.0.1",
		bootstrap.EnvReadOnlyNetSysctl + "=1",
		bootstrap.EnvHostPrep + "=packages-only",
		bootstrap.EnvLoopbackCNI + "=1",
		bootstrap.EnvSnapshotter + "=native",
		bootstrap.EnvRestrictOOMScore + "=1",
		bootstrap.EnvSkipSandboxImageCheck + "=1",
	}
}

// Pods is the environment of a host with a network namespace of its own
// (the kubelet's default ports, its node IP, a real pod network). What
// stays of the machine: its kernel (packages-only preparation), the
// overlayfs disk (native snapshotter), no CAP_SYS_RESOURCE (restricted oom
// scores) and cgroup v1 (writable controllers of the host's own).
func Pods(nodeIP netip.Addr) []string {
	return []string{
		bootstrap.EnvNodeIP + "=" + nodeIP.String(),
		bootstrap.EnvHostPrep + "=packages-only",
		bootstrap.EnvSnapshotter + "=native",
		bootstrap.EnvRestrictOOMScore + "=1",
		bootstrap.EnvCgroupV1Writable + "=1",
	}
}
