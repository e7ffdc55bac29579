// Package watcher holds whole-system tests of the watcher agent on rig hosts: its reaction to Machines, path units, certificate rotation, idle cost and metrics.
// Its hosts and control plane come from integration/rig; only `go test` builds it.
package watcher

import (
	"os"
	"testing"

	"github.com/kubeslot/kubeslot/integration/rig"
)

// TestMain starts the package's control plane and checks the machine for leaks afterwards (rig.Main).
func TestMain(m *testing.M) { os.Exit(rig.Main(m)) }
