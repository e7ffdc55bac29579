package main

import (
	"context"
	"os"

	"github.com/alecthomas/kong"
	"github.com/kubeslot/kubeslot/lib/bootstrap"
	"github.com/kubeslot/kubeslot/lib/cli"
	"github.com/kubeslot/kubeslot/lib/stagekit"
)

const name = bootstrap.Stage

type flags struct {
	cli.Globals
	Config    string `help:"Bootstrap configuration (TOML)." default:"/etc/kubeslot/config.toml" type:"path"`
	Preflight bool   `help:"Report what would change and what is missing; change nothing."`
}

// SystemdNeeded: every run but --preflight starts and reloads units
// (cli.SystemdUser: refused up front in a sandbox without --systemd-bus).
func (f *flags) SystemdNeeded() bool { return !f.Preflight }

func main() { os.Exit(run(os.Args[1:], cli.StdIO())) }

func run(args []string, stdio cli.IO) int {
	var f flags
	return cli.Run(name, "kubeslot-bootstrap turns this host into a Kubernetes worker node on slot a.", &f, args, stdio, os.Getenv,
		func(ctx context.Context, _ *kong.Context, h stagekit.Host) error {
			return bootstrap.Command{Host: h, ConfigFile: f.Config, Preflight: f.Preflight}.Run(ctx)
		})
}
