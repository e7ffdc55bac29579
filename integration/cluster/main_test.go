// Package cluster holds whole-system tests of the cluster API and control-plane side of kubeslot: the CRDs and their validation, agent access, install and uninstall, tokens, CNI and drain.
// Its hosts and control plane come from integration/rig; only `go test` builds it.
package cluster

import (
	"os"
	"testing"

	"github.com/kubeslot/kubeslot/integration/rig"
)

// TestMain starts the package's control plane and checks the machine for leaks afterwards (rig.Main).
func TestMain(m *testing.M) { os.Exit(rig.Main(m)) }
