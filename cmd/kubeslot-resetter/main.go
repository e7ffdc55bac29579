// Command kubeslot-resetter removes kubeslot from this host, leaving it as it was before bootstrap.
//
// Its logic has not been built yet: it parses its flags, then exits 2 with
// "not implemented yet" so that no unit or script mistakes it for success.
package main

import (
	"os"

	"github.com/kubeslot/kubeslot/lib/cli"
)

const name = "kubeslot-resetter"

type flags struct {
	cli.Globals
	Yes    bool `help:"Do not ask for confirmation."`
	DryRun bool `help:"List what would be removed; change nothing."`
}

func main() { os.Exit(run(os.Args[1:], cli.StdIO())) }

func run(args []string, stdio cli.IO) int {
	return cli.RunStub(name, "kubeslot-resetter removes kubeslot from this host, leaving it as it was before bootstrap.", &flags{}, args, stdio)
}
