// Package rollout holds whole-system tests of fleet rollouts: one host at a time, failure budgets, leases, canaries, forged entries, and a rollout across rig hosts.
// Its hosts and control plane come from integration/rig; only `go test` builds it.
package rollout

import (
	"os"
	"testing"

	"github.com/kubeslot/kubeslot/integration/rig"
)

// TestMain starts the package's control plane and checks the machine for leaks afterwards (rig.Main).
func TestMain(m *testing.M) { os.Exit(rig.Main(m)) }
