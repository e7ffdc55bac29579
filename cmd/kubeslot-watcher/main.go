package main

import (
	"context"
	"os"
	"time"
	// The maintenance windows name IANA time zones (lib/window), and a
	// host may have no zone database: the binary carries its own.
	_ "time/tzdata"

	"github.com/alecthomas/kong"

	"github.com/kubeslot/kubeslot/lib/cli"
	"github.com/kubeslot/kubeslot/lib/stagekit"
	"github.com/kubeslot/kubeslot/lib/watcher"
)

const name = watcher.Stage

type flags struct {
	cli.Globals
	Kubeconfig string        `help:"Kubeconfig with the node identity (default: <host-root>/identity/kubeconfig)." placeholder:"FILE"`
	LockWait   time.Duration `help:"How long each round of waiting for the installation lock lasts; between rounds the watcher logs who holds it and tells systemd it is alive. It waits until it has the lock." env:"KUBESLOT_WATCHER_LOCK_WAIT" default:"30s"`
	ReadyAfter time.Duration `help:"Tell systemd READY after this long even if the cluster was never reached (the watcher keeps retrying)." env:"KUBESLOT_WATCHER_READY_AFTER" default:"60s"`
	// UpgradeProbation is short in tests; in production the default gives a
	// new release time to crash and be rolled back by the recovery unit
	// before last-good moves to it.
	// Config must be units.ConfigPath by default (main_test.go).
	Config           string        `help:"The operator's configuration file (a host path), read at start for its [metrics] table only; \"\" serves no metrics." env:"KUBESLOT_WATCHER_CONFIG" default:"/etc/kubeslot/config.toml" placeholder:"FILE"`
	UpgradeProbation time.Duration `help:"How long a new release's watcher stays on probation after it reported its agent upgrade Succeeded: a failure in that time is rolled back by the recovery unit (and reported), and last-good moves to the release only after it." env:"KUBESLOT_WATCHER_UPGRADE_PROBATION" default:"30s"`
	// RolloutLease and RolloutPoll are short only in tests (the rig's
	// three-host rollout, whose dead holder's slot must expire within the
	// test); production keeps lib/rollout's defaults.
	RolloutLease time.Duration `help:"Duration of the rollout slots (RolloutLeases) this agent takes; renewed every third of it, taken over by others after it passed unrenewed." env:"KUBESLOT_WATCHER_ROLLOUT_LEASE" default:"60s"`
	RolloutPoll  time.Duration `help:"How often a waiting agent asks for a rollout slot." env:"KUBESLOT_WATCHER_ROLLOUT_POLL" default:"10s"`
}

func main() { os.Exit(run(os.Args[1:], cli.StdIO())) }

func run(args []string, stdio cli.IO) int {
	var f flags
	return cli.Run(name, "kubeslot-watcher follows this host's Machine in the cluster and dispatches work to the other stages.", &f, args, stdio, os.Getenv,
		func(ctx context.Context, _ *kong.Context, h stagekit.Host) error {
			return watcher.Command{Host: h, Kubeconfig: f.Kubeconfig, LockWait: f.LockWait, ReadyAfter: f.ReadyAfter,
				UpgradeProbation: f.UpgradeProbation, RolloutLease: f.RolloutLease, RolloutPoll: f.RolloutPoll, Config: f.Config}.Run(ctx)
		})
}
