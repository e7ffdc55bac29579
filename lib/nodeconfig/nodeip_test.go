package nodeconfig

import (
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/testkit"
)

// TestKubeletNodeIPFromHook: without a pinned node IP the kubelet takes the
// pre-start hook's (NodeIPEnv, unset: none); a pinned one is on its command
// line and the variable is not.
func TestKubeletNodeIPFromHook(t *testing.T) {
	cfg := testConfig(t, testkit.CA(t), "")
	unit := string(render(t, cfg, Options{})[KubeletUnitPath].Data)
	if !strings.Contains(unit, " $"+NodeIPEnv+" ") || strings.Contains(unit, "--node-ip") {
		t.Errorf("unpinned kubelet unit:\n%s", unit)
	}
	unit = string(render(t, cfg, Options{NodeIP: "10.0.0.5"})[KubeletUnitPath].Data)
	if strings.Contains(unit, NodeIPEnv) || !strings.Contains(unit, "--node-ip=10.0.0.5") {
		t.Errorf("pinned kubelet unit:\n%s", unit)
	}
	if !strings.HasPrefix(NodeIPDropIn, "/etc/systemd/system/"+KubeletUnit+".d/") {
		t.Errorf("drop-in %s is not the kubelet unit's", NodeIPDropIn)
	}
}
