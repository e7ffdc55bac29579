// Command kubeslot-repaver moves the node onto the other slot, or restarts it in place.
//
// Its logic has not been built yet: it parses its flags, then exits 2 with
// "not implemented yet" so that no unit or script mistakes it for success.
package main

import (
	"os"

	"github.com/kubeslot/kubeslot/lib/cli"
)

const name = "kubeslot-repaver"

type flags struct {
	cli.Globals
	Slot    string `arg:"" optional:"" help:"Target slot: a, b, or next (the slot that is not active)." default:"next"`
	Restart bool   `help:"Restart the node in place instead of repaving."`
}

func main() { os.Exit(run(os.Args[1:], cli.StdIO())) }

func run(args []string, stdio cli.IO) int {
	return cli.RunStub(name, "kubeslot-repaver moves the node onto the other slot, or restarts it in place.", &flags{}, args, stdio)
}
