// Package node holds whole-system tests of the node machine: a kubelet in systemd-nspawn joining by TLS bootstrap, the nspawn backend driven directly, devices, overlay slots, the node network and pods on a kubeslot node.
// Its hosts and control plane come from integration/rig; only `go test` builds it.
package node

import (
	"os"
	"testing"

	"github.com/kubeslot/kubeslot/integration/rig"
)

// TestMain starts the package's control plane and checks the machine for leaks afterwards (rig.Main).
func TestMain(m *testing.M) { os.Exit(rig.Main(m)) }
