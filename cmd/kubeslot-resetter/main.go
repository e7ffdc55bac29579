// Command kubeslot-resetter removes kubeslot from this host, leaving it as it
// was before bootstrap: every kubeslot unit, node machine, nspawn setting,
// slot rootfs and host change the ownership journal records, then the host
// root and, last, the ownership record. The stage is in lib/reset
// (Command); this file only turns flags and environment into its input.
//
// Entry points: by hand (asks for confirmation on stdin unless --yes;
// --dry-run lists what would be removed and changes nothing); from an
// AgentReset request: kubeslot-reset.service sets KUBESLOT_REQUEST=reset and
// the run hands the request over to kubeslot-resetting.service; and
// --resume, what that unit runs from its own copy of this binary: it claims
// the request, does the work, reports it Succeeded and stops the watcher
// last, never prompting. Killed, or cut by a power loss, it is started again
// by systemd and finishes the reset under way (lib/reset).
//
// Exit codes: 0 done, or nothing to reset (no ownership record); 1 failed
// (the record stays "resetting"; a re-run resumes); 2 usage, or no
// confirmation; 69 the installation lock stayed busy; 78 the host's layout
// version is not this release's (refused before anything, unless --force).
//
// Kept on purpose: /etc/kubeslot/config.toml, the operator's input, but
// without its join token (cluster.bootstrap_token becomes a comment, the
// rest stays byte for byte): a reset host keeps no credential that can join
// a cluster. With the first-boot unit removed, nothing bootstraps from it at
// the next boot; a fresh token and `kubeslot-bootstrap --config` (or a
// re-enabled unit) reinstall.
//
// Environment for tests only: KUBESLOT_TEST_PAUSE_AT=<step> stops the run
// before that step (lib/reset step names) and waits to be killed.
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
	"github.com/kubeslot/kubeslot/lib/reset"
)

const name = "kubeslot-resetter"

// envRequest is set by kubeslot-reset.service: serve the pending request.
const envRequest = "KUBESLOT_REQUEST"

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

func run(args []string, stdio cli.IO) int {
	return runEnv(args, stdio, os.Getenv)
}

func runEnv(args []string, stdio cli.IO, getenv func(string) string) int {
	var f flags
	return cli.Run(name, "kubeslot-resetter removes kubeslot from this host, leaving it as it was before bootstrap.", &f, args, stdio, func(ctx context.Context, _ *kong.Context, log *slog.Logger) error {
		return stage(ctx, &f, log, stdio, getenv)
	})
}

// stage checks the input, before anything on the host is touched, and
// runs the stage (lib/reset).
func stage(ctx context.Context, f *flags, log *slog.Logger, stdio cli.IO, getenv func(string) string) error {
	t0 := time.Now()
	request := false
	switch v := getenv(envRequest); v {
	case "":
	case "reset":
		request = true
	default:
		return exitcode.UsageError(fmt.Errorf("%s=%q: want reset or nothing", envRequest, v))
	}
	root, err := f.Root()
	if err != nil {
		return exitcode.UsageError(err)
	}
	// The layout check, before anything changes: another layout version
	// ends the run with exit 78 unless --force. A reset must stay possible
	// on a host an older release cannot read (the way out of a layout no
	// release at hand understands), but only knowingly: the journal and the
	// base are what this release removes, and a newer layout may keep
	// things elsewhere that it does not know of.
	if err := root.CheckLayout(); err != nil {
		if !f.Force {
			return fmt.Errorf("%w (kubeslot-resetter --force resets from what the ownership record still says)", err)
		}
		log.Warn("resetting a host whose layout this release does not understand (--force)", "err", err.Error())
	}
	return reset.Command{Root: root, SystemdBus: f.SystemdBus, Request: request, Yes: f.Yes, DryRun: f.DryRun, Force: f.Force,
		Resume: f.Resume, LockWait: f.LockWait, PublishWait: f.PublishWait, Getenv: getenv,
		Stdin: stdio.Stdin, Stdout: stdio.Stdout, Log: log, Started: t0}.Run(ctx)
}
