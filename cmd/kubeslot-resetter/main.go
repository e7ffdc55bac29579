package main

import (
	"context"
	"os"
	"time"

	"github.com/alecthomas/kong"
	"github.com/kubeslot/kubeslot/lib/cli"
	"github.com/kubeslot/kubeslot/lib/reset"
	"github.com/kubeslot/kubeslot/lib/stagekit"
)

const name = reset.Stage

type flags struct {
	cli.Globals
	Yes         bool          `help:"Do not ask for confirmation."`
	DryRun      bool          `help:"List what would be removed; change nothing."`
	Force       bool          `help:"Reset even when the ownership record is damaged: what it still says is undone, what it lost is listed and left (see --dry-run --force)."`
	Resume      bool          `help:"Only finish a reset under way, never start one (what kubeslot-resetting.service runs); with none under way, remove what is left of that unit."`
	LockWait    time.Duration `help:"How long to wait for the installation lock before deferring (exit 69)." default:"30s"`
	PublishWait time.Duration `help:"Request path: how long to give the watcher to publish the result before it is stopped." default:"20s"`
}

// SystemdNeeded: every run but --dry-run stops units and reloads systemd,
// so a sandboxed root without --systemd-bus is refused before anything,
// the record included, is changed (lib/cli).
func (f *flags) SystemdNeeded() bool { return !f.DryRun }

func main() { os.Exit(run(os.Args[1:], cli.StdIO())) }

func run(args []string, stdio cli.IO) int { return runEnv(args, stdio, os.Getenv) }

func runEnv(args []string, stdio cli.IO, getenv func(string) string) int {
	var f flags
	return cli.Run(name, "kubeslot-resetter removes kubeslot from this host, leaving it as it was before bootstrap.", &f, args, stdio, getenv,
		func(ctx context.Context, _ *kong.Context, h stagekit.Host) error {
			return reset.Command{Host: h, Yes: f.Yes, DryRun: f.DryRun, Force: f.Force, Resume: f.Resume,
				LockWait: f.LockWait, PublishWait: f.PublishWait}.Run(ctx)
		})
}
