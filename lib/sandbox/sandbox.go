// Package sandbox reads a host's test and sandbox settings: the record the
// bootstrap left (state.Sandbox, <base>/state/sandbox.json) with the
// environment overriding it field by field, and the isolation backend
// settings they make. A production host sets none of them and has no record.
//
// It sits apart from lib/bootstrap so that the watcher can read the settings
// without linking the bootstrap's typed Kubernetes clientset (the
// watcher's resident memory). It imports lib/hostroot, lib/state and
// lib/isolation/hostapi only. Imported by lib/stagekit (the stage driver,
// which loads it for lib/bootstrap and lib/repave), lib/watcher, and
// lib/slot (the sandbox image check).
package sandbox

import (
	"fmt"
	"strconv"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
	"github.com/kubeslot/kubeslot/lib/state"
)

// Environment variables for tests and sandboxes. A production host sets
// none of them. A rig host shares the test machine's kernel and network
// namespace, so it must keep its hands off what belongs to the machine.
const (
	// EnvKubeletPort, EnvHealthzPort: the node kubelet's API and healthz
	// ports on 127.0.0.1 (hostapi.Settings), when several rigs share a
	// loopback.
	EnvKubeletPort = "KUBESLOT_NODE_KUBELET_PORT"
	EnvHealthzPort = "KUBESLOT_NODE_HEALTHZ_PORT"
	// EnvNodeIP is the kubelet's --node-ip.
	EnvNodeIP = "KUBESLOT_NODE_IP"
	// EnvReadOnlyNetSysctl=1 keeps /proc/sys/net read-only in the node.
	EnvReadOnlyNetSysctl = "KUBESLOT_NODE_READONLY_NET_SYSCTL"
	// EnvHostPrep=packages-only restricts host preparation to checking
	// packages: no kernel modules, sysctls or swap (the machine's own).
	EnvHostPrep = "KUBESLOT_HOSTPREP"
	// EnvLoopbackCNI=1: a loopback-only pod network, because the node shares
	// the test machine's network namespace, where no CNI may act.
	EnvLoopbackCNI = "KUBESLOT_NODE_LOOPBACK_CNI"
	// EnvSnapshotter=native: containerd's native snapshotter, because the
	// host's disk is an overlayfs (the rig's hosts).
	EnvSnapshotter = "KUBESLOT_NODE_SNAPSHOTTER"
	// EnvRestrictOOMScoreAdj=1: containerd keeps containers' oom_score_adj
	// at or above its own and the kubelet sets its own to 0, because the
	// machine withholds CAP_SYS_RESOURCE.
	EnvRestrictOOMScoreAdj = "KUBESLOT_NODE_RESTRICT_OOM_SCORE_ADJ"
	// EnvCgroupV1Writable=1: the host has writable v1 controllers of its own
	// (a test machine whose controllers are all bound to cgroup v1): the node
	// remounts them read-write (nspawn mounts them read-only) and its unit
	// allows device creation (a v1 device cgroup cannot allow more than its
	// parent), so containers can start.
	EnvCgroupV1Writable = "KUBESLOT_NODE_CGROUP_V1_WRITABLE"
	// EnvSkipSandboxImageCheck=1: the bootstrap does not ask a registry for
	// the sandbox image, because the test machine must not reach public
	// registries and its loopback-network nodes run no pods.
	EnvSkipSandboxImageCheck = "KUBESLOT_SKIP_SANDBOX_IMAGE_CHECK"
)

// HostPrepPackagesOnly is the value of EnvHostPrep that restricts host
// preparation to packages.
const HostPrepPackagesOnly = "packages-only"

// FromEnv returns rec with the environment overriding it: a variable that
// is set replaces the recorded value (KUBESLOT_NODE_READONLY_NET_SYSCTL=0
// and KUBESLOT_HOSTPREP=full turn a recorded setting off).
func FromEnv(rec state.Sandbox, getenv func(string) string) (state.Sandbox, error) {
	s := rec
	for _, p := range []struct {
		env string
		dst *int
	}{{EnvKubeletPort, &s.KubeletPort}, {EnvHealthzPort, &s.HealthzPort}} {
		if v := getenv(p.env); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 || n > 65535 {
				return rec, fmt.Errorf("%s=%q: want a port number", p.env, v)
			}
			*p.dst = n
		}
	}
	if v := getenv(EnvNodeIP); v != "" {
		s.NodeIP = v
	}
	for _, f := range []struct {
		env string
		dst *bool
	}{{EnvReadOnlyNetSysctl, &s.ReadOnlyNetSysctl}, {EnvLoopbackCNI, &s.LoopbackCNI}, {EnvRestrictOOMScoreAdj, &s.RestrictOOMScoreAdj},
		{EnvCgroupV1Writable, &s.CgroupV1Writable}, {EnvSkipSandboxImageCheck, &s.SkipSandboxImageCheck}} {
		switch v := getenv(f.env); v {
		case "":
		case "0":
			*f.dst = false
		case "1":
			*f.dst = true
		default:
			return rec, fmt.Errorf("%s=%q: want 0 or 1", f.env, v)
		}
	}
	switch v := getenv(EnvSnapshotter); v {
	case "":
	case "native":
		s.Snapshotter = v
	case "overlayfs":
		s.Snapshotter = ""
	default:
		return rec, fmt.Errorf("%s=%q: want native or overlayfs", EnvSnapshotter, v)
	}
	switch v := getenv(EnvHostPrep); v {
	case "":
	case HostPrepPackagesOnly:
		s.HostPrep = v
	case "full":
		s.HostPrep = ""
	default:
		return rec, fmt.Errorf("%s=%q: want %s or full", EnvHostPrep, v, HostPrepPackagesOnly)
	}
	return s, nil
}

// BackendSettings are the isolation backend settings of sb.
func BackendSettings(sb state.Sandbox) hostapi.Settings {
	return hostapi.Settings{KubeletPort: sb.KubeletPort, HealthzPort: sb.HealthzPort, NodeIP: sb.NodeIP,
		ReadOnlyNetSysctl: sb.ReadOnlyNetSysctl, LoopbackCNI: sb.LoopbackCNI, Snapshotter: sb.Snapshotter,
		RestrictOOMScoreAdj: sb.RestrictOOMScoreAdj, CgroupV1Writable: sb.CgroupV1Writable}
}

// Load returns this host's test and sandbox settings: those the bootstrap
// recorded, the environment overriding. A host without a record
// (production, or not bootstrapped yet) starts from none.
func Load(root *hostroot.Root, getenv func(string) string) (state.Sandbox, error) {
	rec, err := state.NewStore(root).LoadSandbox()
	if err != nil {
		return state.Sandbox{}, fmt.Errorf("test and sandbox settings: %w", err)
	}
	return FromEnv(rec, getenv)
}

// LoadSettings returns the backend settings of a later stage (repaver,
// watcher): Load's, as hostapi.Settings.
func LoadSettings(root *hostroot.Root, getenv func(string) string) (hostapi.Settings, error) {
	sb, err := Load(root, getenv)
	return BackendSettings(sb), err
}
