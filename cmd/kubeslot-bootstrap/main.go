// Command kubeslot-bootstrap turns this host into a Kubernetes worker node on slot a.
//
// Its logic has not been built yet: it parses its flags, then exits 2 with
// "not implemented yet" so that no unit or script mistakes it for success.
package main

import (
	"os"

	"github.com/kubeslot/kubeslot/lib/cli"
)

const name = "kubeslot-bootstrap"

type flags struct {
	cli.Globals
	Config    string `help:"Bootstrap configuration (TOML)." default:"/etc/kubeslot/config.toml" type:"path"`
	Preflight bool   `help:"Report what would change and what is missing; change nothing."`
}

func main() { os.Exit(run(os.Args[1:], cli.StdIO())) }

func run(args []string, stdio cli.IO) int {
	return cli.RunStub(name, "kubeslot-bootstrap turns this host into a Kubernetes worker node on slot a.", &flags{}, args, stdio)
}
