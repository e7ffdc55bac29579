// Package bench holds whole-system tests of the performance benchmarks on the rig: the watchers' admission, a simulated fleet's cost on the apiserver, and the rollout's wait (make bench).
// Its hosts and control plane come from integration/rig; only `go test` builds it.
package bench

import (
	"flag"
	"os"
	"testing"

	"github.com/kubeslot/kubeslot/integration/rig"
)

// TestMain starts the package's control plane and checks the machine for leaks afterwards (rig.Main), when a
// benchmark is asked for: the package has no tests, and `make test` should not pay for a control plane it would not
// use.
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		os.Exit(m.Run())
	}
	os.Exit(rig.Main(m))
}
