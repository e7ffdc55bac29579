// Command kubeslot-watcher is the long-running stage: it follows this host's
// Machine, its MachineOperations and its Node in the cluster, drops request
// files for the worker stages, and publishes their results (lib/watcher).
//
// Phases, top-down: parse flags → logger → host root → installation lock
// (bounded) → defer (exit 69, no error line) unless the installation is
// complete → load the active applied configuration (a damaged one is
// reported as Degraded, never acted on) → cluster client from the node
// identity → release the lock → run (READY after the first sync, watchdog
// pings) until SIGTERM, rebuilding the client when the identity changes and
// re-executing the binary behind <base>/current when it changes.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/kubeslot/kubeslot/lib/cli"
	"github.com/kubeslot/kubeslot/lib/exitcode"
)

const name = "kubeslot-watcher"

type flags struct {
	cli.Globals
	Kubeconfig string        `help:"Kubeconfig with the node identity (default: <host-root>/identity/kubeconfig)." placeholder:"FILE"`
	LockWait   time.Duration `help:"How long to wait for the installation lock before deferring (exit 69)." default:"30s"`
	ReadyAfter time.Duration `help:"Tell systemd READY after this long even if the cluster was never reached (the watcher keeps retrying)." env:"KUBESLOT_WATCHER_READY_AFTER" default:"60s"`
}

func main() { os.Exit(run(os.Args[1:], cli.StdIO())) }

func run(args []string, stdio cli.IO) int {
	var f flags
	if _, code, done := cli.Parse(name, "kubeslot-watcher follows this host's Machine in the cluster and dispatches work to the other stages.", &f, args, stdio); done {
		return code
	}
	log, err := f.Logger(stdio.Stderr, name)
	if err != nil {
		return cli.Exit(log, err)
	}
	root, err := f.Root()
	if err != nil {
		return cli.Exit(log, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	st, err := start(ctx, root, f, log)
	if err != nil {
		if exitcode.Of(err) == exitcode.Deferred {
			// A Type=notify service that exits before READY=1 is a protocol
			// failure whatever its exit status: say READY first, so 69 leaves
			// the unit inactive and not failed.
			_, _ = daemon.SdNotify(false, daemon.SdNotifyReady+"\nSTATUS=deferred: "+err.Error())
		}
		return cli.Exit(log, err)
	}
	return cli.Exit(log, serve(ctx, st, f, log))
}
