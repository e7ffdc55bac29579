// Command kubeslot-upgrader replaces kubeslot itself with a new release bundle.
//
// Its logic has not been built yet: it parses its flags, then exits 2 with
// "not implemented yet" so that no unit or script mistakes it for success.
package main

import (
	"os"

	"github.com/kubeslot/kubeslot/lib/cli"
)

const name = "kubeslot-upgrader"

type flags struct {
	cli.Globals
	Bundle string `help:"Upgrade from this bundle file instead of the pending request." type:"path"`
}

func main() { os.Exit(run(os.Args[1:], cli.StdIO())) }

func run(args []string, stdio cli.IO) int {
	return cli.RunStub(name, "kubeslot-upgrader replaces kubeslot itself with a new release bundle.", &flags{}, args, stdio)
}
