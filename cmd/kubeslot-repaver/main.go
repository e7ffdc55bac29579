package main

import (
	"context"
	"os"
	"time"

	"github.com/alecthomas/kong"
	"github.com/kubeslot/kubeslot/lib/cli"
	"github.com/kubeslot/kubeslot/lib/repave"
	"github.com/kubeslot/kubeslot/lib/stagekit"
)

const name = repave.Stage

type flags struct {
	cli.Globals
	Slot     string        `arg:"" optional:"" help:"Target slot: a, b, or next (the slot that is not active). Default: $KUBESLOT_SLOT, else next."`
	Restart  bool          `help:"Restart the node in place instead of repaving."`
	Config   string        `help:"Desired configuration (TOML) of a repave by hand; default: the active applied configuration." type:"path" placeholder:"FILE"`
	LockWait time.Duration `help:"How long to wait for the installation lock before deferring (exit 69)." default:"30s"`
	NoDrain  bool          `help:"Do not cordon and drain the node first (a repave or restart by hand only; a request is drained with the Machine's spec.disruption)."`
}

// SystemdNeeded: a repave or restart always stops and starts node units
// (cli.SystemdUser).
func (f *flags) SystemdNeeded() bool { return true }

func main() { os.Exit(run(os.Args[1:], cli.StdIO())) }

func run(args []string, stdio cli.IO) int {
	var f flags
	return cli.Run(name, "kubeslot-repaver moves the node onto the other slot, or restarts it in place.", &f, args, stdio, os.Getenv,
		func(ctx context.Context, _ *kong.Context, h stagekit.Host) error {
			return repave.Command{Host: h, Slot: f.Slot, Restart: f.Restart, ConfigFile: f.Config, NoDrain: f.NoDrain,
				LockWait: f.LockWait}.Run(ctx)
		})
}
