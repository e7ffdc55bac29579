package nodeconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/testkit"
)

// TestDetectCgroups: the production profile only on cgroup v2 with cpu,
// memory and pids; anything else is the named fallback.
func TestDetectCgroups(t *testing.T) {
	for _, c := range []struct {
		controllers *string
		want        Cgroups
	}{
		{ptr("cpuset cpu io memory hugetlb pids rdma misc\n"), CgroupsSystemd},
		{ptr("cpuset io memory pids\n"), CgroupsNoControllers}, // no cpu
		{ptr(""), CgroupsNoControllers},                        // the rig: cgroup2 without controllers
		{nil, CgroupsNoControllers},                            // v1: no cgroup.controllers at /sys/fs/cgroup
	} {
		dir := t.TempDir()
		if c.controllers != nil {
			p := filepath.Join(dir, "sys/fs/cgroup")
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(p, "cgroup.controllers"), []byte(*c.controllers), 0o444); err != nil {
				t.Fatal(err)
			}
		}
		root := testkit.RootAt(t, dir)
		if got := DetectCgroups(root); got != c.want {
			t.Errorf("controllers %v: %s, want %s", c.controllers, got, c.want)
		}
	}
	if n := CgroupsNoControllers.Note(); !strings.Contains(n, "fallback cgroupfs-no-qos") {
		t.Errorf("the fallback is not named: %q", n)
	}
}

func ptr(s string) *string { return &s }
