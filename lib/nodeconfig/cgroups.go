package nodeconfig

import (
	"os"
	"slices"
	"strings"

	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// nodeControllers are the cgroup v2 controllers the kubelet needs for QoS
// cgroups and node allocatable.
var nodeControllers = []string{"cpu", "memory", "pids"}

// DetectCgroups reads the host's cgroup layout under root and returns the
// node's cgroup profile: CgroupsSystemd on a cgroup v2 host (cgroup2 at
// /sys/fs/cgroup) whose root offers the cpu, memory and pids controllers,
// which systemd delegates to the node's unit; otherwise the named fallback.
// A host root without /sys (tests) gets the fallback.
func DetectCgroups(root *hostroot.Root) Cgroups {
	p, err := root.Resolve("/sys/fs/cgroup/cgroup.controllers")
	if err != nil {
		return CgroupsNoControllers
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return CgroupsNoControllers
	}
	have := strings.Fields(string(b))
	for _, c := range nodeControllers {
		if !slices.Contains(have, c) {
			return CgroupsNoControllers
		}
	}
	return CgroupsSystemd
}

// Note says what a profile means for the node, for preflight and logs:
// the fallback is named, never silent.
func (c Cgroups) Note() string {
	if c == CgroupsSystemd {
		return "cgroup v2 with cpu, memory and pids: systemd cgroup driver, QoS cgroups, node allocatable enforced"
	}
	return "fallback " + string(c) + ": the host offers no cgroup v2 cpu, memory and pids controllers (cgroup v1 or hybrid): " +
		"cgroupfs driver, no QoS cgroups, node allocatable not enforced, pods not isolated from each other's resource use"
}
