// Package repave holds whole-system tests of changing a running node: repave, upgrade and its probation, Kubernetes upgrades, self-heal, reset and drain with pods.
// Its hosts and control plane come from integration/rig; only `go test` builds it.
package repave

import (
	"os"
	"testing"

	"github.com/kubeslot/kubeslot/integration/rig"
)

// TestMain starts the package's control plane and checks the machine for leaks afterwards (rig.Main).
func TestMain(m *testing.M) { os.Exit(rig.Main(m)) }
