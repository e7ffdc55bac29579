// Command kubeslot-repaver moves the node onto the other slot (repave), or
// restarts it in place. The stage is in lib/repave (Command); this file
// only turns flags and environment into its input.
//
// What it does, in order: take the installation lock (busy → exit 69, the
// request stays for the path unit); defer (69) unless the installation is
// complete; resume an interrupted repave from <base>/state/repave.json; else
// claim the pending request of its kind by rename (requests/repave.json or
// restart.json); else work by hand. A repave by hand (`systemctl start
// kubeslot-repave@b`, or `kubeslot-repaver b`) rebuilds the ACTIVE applied
// configuration onto the target slot, or the configuration of --config.
//
// Kind and slot: --restart or KUBESLOT_REQUEST=restart restart in place;
// otherwise a repave onto the slot argument, else KUBESLOT_SLOT, else "next"
// (the slot that is not active). A run started by a path unit (systemd sets
// TRIGGER_PATH) that finds no request to claim does nothing. Before it stops
// the node, the repaver cordons it and evicts its pods (lib/drain) with the
// request's policy, or the defaults by hand; --no-drain skips that by hand.
//
// Exit codes: 0 done; 1 failed (a rolled-back repave included: the status
// file says why); 2 usage; 69 deferred (lock busy, bootstrap unfinished);
// 78 the host's layout version is not this release's, nothing changed.
//
// Environment for tests and sandboxes only: those of kubeslot-bootstrap
// (KUBESLOT_NODE_KUBELET_PORT, KUBESLOT_NODE_HEALTHZ_PORT, KUBESLOT_NODE_IP,
// KUBESLOT_NODE_READONLY_NET_SYSCTL=1), and the test hook
// KUBESLOT_TEST_PAUSE_AT=<phase> (prepare, standby, drain, switch, start,
// verify, commit, uncordon, clean, rollback, rollback-verify, restart-node): the run stops before that
// phase, its state written, and waits to be killed.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/alecthomas/kong"
	"github.com/kubeslot/kubeslot/lib/cli"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/repave"
	"github.com/kubeslot/kubeslot/lib/requests"
)

const name = repave.Stage

// Environment set by the worker units (lib/requests).
const (
	envRequest = "KUBESLOT_REQUEST"
	envSlot    = "KUBESLOT_SLOT"
)

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
	return cli.Run(name, "kubeslot-repaver moves the node onto the other slot, or restarts it in place.", &f, args, stdio, func(ctx context.Context, _ *kong.Context, log *slog.Logger) error {
		return stage(ctx, &f, log, stdio, os.Getenv)
	})
}

// job reads what to do from the flags and the unit's environment.
func job(f *flags, getenv func(string) string) (repave.Job, error) {
	j := repave.Job{Kind: requests.Repave, Slot: f.Slot, Triggered: getenv("TRIGGER_PATH") != "", SkipDrain: f.NoDrain}
	switch r := getenv(envRequest); {
	case f.Restart || r == string(requests.Restart):
		j.Kind = requests.Restart
	case r == "" || r == string(requests.Repave):
	default:
		return j, fmt.Errorf("%s=%q: the repaver handles repave and restart", envRequest, r)
	}
	if j.Slot == "" {
		j.Slot = getenv(envSlot)
	}
	if j.Slot == "" {
		j.Slot = repave.NextSlot
	}
	if f.Config != "" {
		if j.Kind == requests.Restart {
			return j, errors.New("--config applies to a repave, not to --restart")
		}
		cfg, err := config.LoadForStage(f.Config)
		if err != nil {
			return j, err
		}
		j.Config = cfg
	}
	return j, nil
}

// stage checks the input, before anything on the host is touched, and
// runs the stage (lib/repave).
func stage(ctx context.Context, f *flags, log *slog.Logger, stdio cli.IO, getenv func(string) string) error {
	t0 := time.Now()
	j, err := job(f, getenv)
	if err != nil {
		return exitcode.UsageError(err)
	}
	root, err := f.Root()
	if err != nil {
		return exitcode.UsageError(err)
	}
	// The layout check, before anything changes: another layout version
	// ends the run with exit 78 (hostroot.CheckLayout).
	if err := root.CheckLayout(); err != nil {
		return err
	}
	return repave.Command{Root: root, SystemdBus: f.SystemdBus, Job: j, LockWait: f.LockWait,
		Getenv: getenv, Stdout: stdio.Stdout, Log: log, Started: t0}.Run(ctx)
}
