// Command kubeslot-watcher is the long-running stage: it follows this host's
// Machine, its MachineOperations and its Node in the cluster, drops request
// files for the worker stages, and publishes their results. The stage, its
// start-up and its supervision included, is lib/watcher's Command; this file
// only turns flags and environment into its input.
//
// Phases, top-down: parse flags → logger → host root → layout version
// (another one: exit 78, nothing done) → installation lock
// (bounded) → defer (exit 69, no error line) unless the installation is
// complete or being reset (a boot in the middle of an AgentReset: the
// watcher publishes its result) → load the active applied configuration (a
// damaged one is reported as Degraded, never acted on) → ask the active
// slot's node operator to ensure its lifecycle hooks (a failure is reported,
// not fatal; not while resetting)
// → cluster client from the node identity → release the lock → run (READY
// after the first sync, watchdog pings) until SIGTERM, rebuilding the client
// when the identity changes.
//
// Started as <base>/current/kubeslot-watcher (the unit), it follows that
// path: when an upgrade flips current or the host root is moved, so that
// the path leads to another binary, the watcher stops its loop and
// re-executes that binary in the same process (same PID, same
// unit invocation), and the new release's watcher reports the upgrade (the
// pending-upgrade signal, lib/requests). It never restarts its own unit.
//
// Test hook: KUBESLOT_TEST_WATCHER_EXIT_AFTER=<Go duration> makes the
// watcher log a warning and exit 1 that long after it started ("0s": at
// once, before READY), as a broken release would.
// KUBESLOT_TEST_WATCHER_READ_GATE=<file> holds every read of the applied
// state between its two files (active, then the slot's configuration) for
// as long as that file exists (at most 5 minutes each), so that a rig test
// can land a real commit inside the read.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/alecthomas/kong"

	"github.com/kubeslot/kubeslot/lib/cli"
	"github.com/kubeslot/kubeslot/lib/exitcode"
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

// EnvTestExitAfter is the fault hook for rig tests: a watcher that exits 1
// that long after it started stands in for a broken release.
const EnvTestExitAfter = "KUBESLOT_TEST_WATCHER_EXIT_AFTER"

func main() { os.Exit(run(os.Args[1:], cli.StdIO())) }

func run(args []string, stdio cli.IO) int {
	t0 := time.Now()
	var f flags
	return cli.Run(name, "kubeslot-watcher follows this host's Machine in the cluster and dispatches work to the other stages.", &f, args, stdio, func(ctx context.Context, _ *kong.Context, log *slog.Logger) error {
		return stage(ctx, &f, log, t0)
	})
}

// stage checks the flags, arms the exit test hook and runs the stage
// (lib/watcher).
func stage(ctx context.Context, f *flags, log *slog.Logger, t0 time.Time) error {
	if f.UpgradeProbation <= 0 {
		return exitcode.UsageError(fmt.Errorf("--upgrade-probation %s: want a positive duration", f.UpgradeProbation))
	}
	if f.RolloutLease < 3*time.Second || f.RolloutPoll <= 0 {
		return exitcode.UsageError(fmt.Errorf("--rollout-lease %s, --rollout-poll %s: want a lease of 3s or more (renewed every third of it) and a positive poll", f.RolloutLease, f.RolloutPoll))
	}
	if exit, err := testExitAfter(os.Getenv(EnvTestExitAfter)); err != nil {
		return err
	} else if exit != nil {
		if *exit <= 0 {
			log.Warn("test hook: exiting 1 at start", "env", EnvTestExitAfter)
			return cli.Reported(exitcode.Failure)
		}
		time.AfterFunc(time.Until(t0.Add(*exit)), func() {
			log.Warn("test hook: exiting 1", "env", EnvTestExitAfter, "after", *exit)
			os.Exit(exitcode.Failure)
		})
	}
	root, err := f.Root()
	if err != nil {
		return err
	}
	// The layout check, before anything changes: another layout version
	// ends the run with exit 78 (hostroot.CheckLayout).
	if err := root.CheckLayout(); err != nil {
		return err
	}
	return watcher.Command{Root: root, SystemdBus: f.SystemdBus, Kubeconfig: f.Kubeconfig, LockWait: f.LockWait,
		ReadyAfter: f.ReadyAfter, UpgradeProbation: f.UpgradeProbation, RolloutLease: f.RolloutLease, RolloutPoll: f.RolloutPoll,
		Getenv: os.Getenv, Log: log, Started: t0, Config: f.Config}.Run(ctx)
}

// testExitAfter parses the EnvTestExitAfter hook: nil when unset.
func testExitAfter(v string) (*time.Duration, error) {
	if v == "" {
		return nil, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return nil, exitcode.UsageError(fmt.Errorf("%s=%q: want a Go duration such as 0s or 5s", EnvTestExitAfter, v))
	}
	return &d, nil
}
