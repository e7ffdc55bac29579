// Package host holds whole-system tests of the isolated systemd hosts the rig runs on (integration/sdhost), kubeslot's units on them, the system bus and stage logs in the journal.
// Its hosts and control plane come from integration/rig; only `go test` builds it.
package host

import (
	"os"
	"testing"

	"github.com/kubeslot/kubeslot/integration/rig"
)

// TestMain starts the package's control plane and checks the machine for leaks afterwards (rig.Main).
func TestMain(m *testing.M) { os.Exit(rig.Main(m)) }
