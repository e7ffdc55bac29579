// Package soak holds whole-system tests of the chaos test (make soak): random operations, kills and power cuts on one rig host, the host's invariants checked after each round.
// Its hosts and control plane come from integration/rig; only `go test` builds it.
package soak

import (
	"os"
	"testing"

	"github.com/kubeslot/kubeslot/integration/rig"
)

// TestMain starts the package's control plane and checks the machine for leaks afterwards (rig.Main).
func TestMain(m *testing.M) { os.Exit(rig.Main(m)) }
