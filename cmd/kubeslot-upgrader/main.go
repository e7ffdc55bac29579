// Command kubeslot-upgrader replaces kubeslot itself (every binary and unit
// file, as one bundle) on a running host, and `kubeslot-upgrader recover`
// falls back to the last good release. The stage is in lib/upgrade
// (Command); this file only turns flags and environment into its input.
//
// Upgrade (the default command), in order: take the installation lock (busy
// → exit 69, the request stays for the path unit); defer (69) unless the
// installation is complete; finish an interrupted upgrade (the pending-
// upgrade signal, or a claimed request); else claim the pending request
// (requests/upgrade.json, from an AgentUpgrade operation), or upgrade by
// hand from --bundle FILE [--sha256 HEX]; then download → last-good →
// unpack → smoke test → signal → switch → units → restart the watcher →
// health gate, or roll back. --preflight says what would change and
// changes nothing. KUBESLOT_REQUEST=upgrade (set by kubeslot-upgrade.service)
// means a run for a request: finding none is nothing to do.
//
// Recover (kubeslot-recovery.service, the watcher's OnFailure=, runs it from
// <base>/last-good): when current is not last-good, point it back, reinstall
// the last-good release's units, record the failure, restart the watcher.
//
// Exit codes: 0 done or nothing to do; 1 failed (refused before the switch,
// or rolled back: the status or the signal says why); 2 usage; 69 deferred;
// 78 the host's layout version is not this release's (recover too: an older
// last-good must not act on a newer layout), nothing changed.
//
// Test hook: KUBESLOT_TEST_PAUSE_AT=<phase> (preflight, download, last-good,
// unpack, smoke-test, signal, switch, units, restart, health, rollback)
// stops the run before that phase (its progress status written) and waits
// to be killed, as in every stage.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/alecthomas/kong"
	"github.com/kubeslot/kubeslot/lib/bundle"
	"github.com/kubeslot/kubeslot/lib/cli"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/upgrade"
)

const name = "kubeslot-upgrader"

// envRequest is set by the worker unit (lib/requests).
const envRequest = "KUBESLOT_REQUEST"

type upgradeCmd struct {
	Bundle        string        `help:"Upgrade by hand from this bundle file instead of the pending request." type:"path" placeholder:"FILE"`
	SHA256        string        `name:"sha256" help:"Expected sha256 of --bundle (hex)." placeholder:"HEX"`
	Preflight     bool          `help:"Say what the upgrade would do and change nothing."`
	JSON          bool          `name:"json" help:"With --preflight: print the plan as JSON."`
	HealthWindow  time.Duration `help:"How long the new watcher must stay up, same PID and no restart, to pass." default:"5s"`
	HealthTimeout time.Duration `help:"How long the new watcher has to pass the health gate before the upgrade rolls back." default:"45s"`
	LockWait      time.Duration `help:"How long to wait for the installation lock before deferring (exit 69)." default:"30s"`
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
	return cli.Run(name, "kubeslot-upgrader replaces kubeslot itself with a new release bundle.", &f, args, stdio, func(ctx context.Context, kctx *kong.Context, log *slog.Logger) error {
		if kctx.Command() == "recover" {
			return recoverStage(ctx, &f, log, stdio)
		}
		return upgradeStage(ctx, &f, log, stdio, os.Getenv)
	})
}

// job reads what to do from the flags and the unit's environment.
func job(f *flags, getenv func(string) string) (upgrade.Job, error) {
	u := f.Upgrade
	j := upgrade.Job{Stage: name, Bundle: u.Bundle, SHA256: u.SHA256,
		HealthWindow: u.HealthWindow, HealthTimeout: u.HealthTimeout, LockWait: u.LockWait}
	switch r := getenv(envRequest); r {
	case "":
	case string(requests.Upgrade):
		j.Triggered = true
	default:
		return j, fmt.Errorf("%s=%q: the upgrader handles upgrade requests only", envRequest, r)
	}
	if u.SHA256 != "" {
		if u.Bundle == "" {
			return j, errors.New("--sha256 goes with --bundle")
		}
		if err := bundle.CheckSHA256(u.SHA256); err != nil {
			return j, fmt.Errorf("--sha256: %w", err)
		}
	}
	if u.JSON && !u.Preflight {
		return j, errors.New("--json goes with --preflight")
	}
	if u.HealthWindow <= 0 || u.HealthTimeout <= u.HealthWindow || u.LockWait <= 0 {
		return j, fmt.Errorf("--health-window %s, --health-timeout %s, --lock-wait %s: want positive bounds, the timeout longer than the window",
			u.HealthWindow, u.HealthTimeout, u.LockWait)
	}
	return j, nil
}

// upgradeStage checks the input, before anything on the host is touched,
// and runs the stage (lib/upgrade).
func upgradeStage(ctx context.Context, f *flags, log *slog.Logger, stdio cli.IO, getenv func(string) string) error {
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
	return upgrade.Command{Root: root, SystemdBus: f.SystemdBus, Job: j, Preflight: f.Upgrade.Preflight, JSON: f.Upgrade.JSON,
		Getenv: getenv, Stdout: stdio.Stdout, Log: log}.Run(ctx)
}

// recoverStage is the recovery unit's command.
func recoverStage(ctx context.Context, f *flags, log *slog.Logger, stdio cli.IO) error {
	if f.Recover.LockWait <= 0 {
		return exitcode.UsageError(fmt.Errorf("--lock-wait %s: want a positive bound", f.Recover.LockWait))
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
	return upgrade.Command{Root: root, SystemdBus: f.SystemdBus, Recover: true,
		Job: upgrade.Job{Stage: name + " recover", LockWait: f.Recover.LockWait}, Stdout: stdio.Stdout, Log: log}.Run(ctx)
}
