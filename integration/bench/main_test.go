// Package bench holds whole-system tests of the performance benchmarks on the rig: the watchers' admission, a simulated fleet's cost on the apiserver, and the rollout's wait (make bench).
// Its hosts and control plane come from integration/rig; only `go test` builds it.
package bench

import (
	"os"
	"testing"

	"github.com/kubeslot/kubeslot/integration/rig"
)

// TestMain starts the package's control plane and checks the machine for leaks afterwards (rig.Main).
func TestMain(m *testing.M) { os.Exit(rig.Main(m)) }
