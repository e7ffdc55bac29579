package main

import (
	"context"
	"os"
	"time"

	"github.com/alecthomas/kong"
	"github.com/kubeslot/kubeslot/lib/cli"
	"github.com/kubeslot/kubeslot/lib/stagekit"
	"github.com/kubeslot/kubeslot/lib/upgrade"
)

const name = "kubeslot-upgrader"

type upgradeCmd struct {
	Bundle        string        `help:"Upgrade by hand from this bundle file instead of the pending request." type:"path" placeholder:"FILE"`
	SHA256        string        `name:"sha256" help:"Expected sha256 of --bundle (hex)." placeholder:"HEX"`
	Preflight     bool          `help:"Say what the upgrade would do and change nothing."`
	JSON          bool          `name:"json" help:"With --preflight: print the plan as JSON."`
	HealthWindow  time.Duration `help:"How long the new watcher must stay up, same PID and no restart, to pass." default:"5s"`
	HealthTimeout time.Duration `help:"How long the new watcher has to pass the health gate before the upgrade rolls back." default:"45s"`
	LockWait      time.Duration `help:"How long to wait for the installation lock before deferring (exit 69)." default:"30s"`
	Config        string        `help:"The operator's configuration file (a host path), read for its [upgrade] table only." default:"/etc/kubeslot/config.toml" placeholder:"FILE"`
}

type recoverCmd struct {
	LockWait time.Duration `help:"How long to wait for the installation lock before deferring (exit 69)." default:"30s"`
}

type flags struct {
	cli.Globals
	Upgrade upgradeCmd `cmd:"" default:"withargs" help:"Upgrade kubeslot from the pending request or --bundle (the default)."`
	Recover recoverCmd `cmd:"" help:"Point current back at last-good and restart the watcher (kubeslot-recovery.service)."`
}

// SystemdNeeded: an upgrade restarts the watcher, and so does recover;
// --preflight changes nothing (cli.SystemdUser).
func (f *flags) SystemdNeeded() bool { return !f.Upgrade.Preflight }

func main() { os.Exit(run(os.Args[1:], cli.StdIO())) }

func run(args []string, stdio cli.IO) int {
	var f flags
	return cli.Run(name, "kubeslot-upgrader replaces kubeslot itself with a new release bundle.", &f, args, stdio, os.Getenv,
		func(ctx context.Context, kctx *kong.Context, h stagekit.Host) error {
			if kctx.Command() == "recover" {
				return upgrade.Command{Host: h, Stage: name + " recover", Recover: true, LockWait: f.Recover.LockWait}.Run(ctx)
			}
			u := f.Upgrade
			return upgrade.Command{Host: h, Stage: name, Bundle: u.Bundle, SHA256: u.SHA256, Preflight: u.Preflight, JSON: u.JSON,
				HealthWindow: u.HealthWindow, HealthTimeout: u.HealthTimeout, LockWait: u.LockWait, Config: u.Config}.Run(ctx)
		})
}
