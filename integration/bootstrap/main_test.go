// Package bootstrap holds whole-system tests of the first-boot stage on rig hosts: bootstrap, its kills and reboots, hooks, image-based hosts, verify and repair, serving certificates, the artifact cache and the host-root migration.
// Its hosts and control plane come from integration/rig; only `go test` builds it.
package bootstrap

import (
	"os"
	"testing"

	"github.com/kubeslot/kubeslot/integration/rig"
)

// TestMain starts the package's control plane and checks the machine for leaks afterwards (rig.Main).
func TestMain(m *testing.M) { os.Exit(rig.Main(m)) }
