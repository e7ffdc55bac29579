// Command kubeslot-watcher follows this host's Machine in the cluster and dispatches work to the other stages.
//
// Its logic has not been built yet: it parses its flags, then exits 2 with
// "not implemented yet" so that no unit or script mistakes it for success.
package main

import (
	"os"

	"github.com/kubeslot/kubeslot/lib/cli"
)

const name = "kubeslot-watcher"

type flags struct {
	cli.Globals
}

func main() { os.Exit(run(os.Args[1:], cli.StdIO())) }

func run(args []string, stdio cli.IO) int {
	return cli.RunStub(name, "kubeslot-watcher follows this host's Machine in the cluster and dispatches work to the other stages.", &flags{}, args, stdio)
}
