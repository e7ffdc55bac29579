// Command kubeslot-resetter removes kubeslot from this host, leaving it as it
// was before bootstrap: every kubeslot unit, node machine, nspawn setting,
// slot rootfs and host change the ownership journal records, then the host
// root and, last, the ownership record. The steps are in lib/reset; this file
// wires them to the real host.
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
// confirmation; 69 the installation lock stayed busy.
//
// Kept on purpose: /etc/kubeslot/config.toml, the operator's input (with
// the first-boot unit removed, nothing bootstraps from it at the next boot;
// `kubeslot-bootstrap --config` or a re-enabled unit reinstalls).
//
// Environment for tests only: KUBESLOT_TEST_PAUSE_AT=<step> stops the run
// before that step (lib/reset step names) and waits to be killed.
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/alecthomas/kong"
	"github.com/kubeslot/kubeslot/lib/cli"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostprep"
	"github.com/kubeslot/kubeslot/lib/reset"
	"github.com/kubeslot/kubeslot/lib/systemdconn"
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

// stage is the top-down list of what the binary does.
func stage(ctx context.Context, f *flags, log *slog.Logger, stdio cli.IO, getenv func(string) string) error {
	t0 := time.Now()
	// 1. Mode, host root, test hook: all checked before anything is touched.
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
	pauseAt := getenv(reset.EnvPauseAt)
	if pauseAt != "" && !reset.ValidStep(pauseAt) {
		return exitcode.UsageError(fmt.Errorf("%s=%q: not a reset step (%s)", reset.EnvPauseAt, pauseAt, strings.Join(reset.StepNames(), ", ")))
	}
	// 2. --dry-run: report, change nothing.
	if f.DryRun {
		_, err := reset.Plan(root, stdio.Stdout, f.Force)
		return err
	}
	// 3. By hand: show the plan and ask (not to finish one under way).
	if !request && !f.Yes && !f.Resume {
		// A forced reset shows its plan (what is salvaged and what is
		// lost) before asking.
		planOut := io.Discard
		if f.Force {
			planOut = stdio.Stdout
		}
		found, err := reset.Plan(root, planOut, f.Force)
		if err != nil {
			return err
		}
		if !found {
			fmt.Fprintln(stdio.Stdout, "nothing to reset: no installation owns this host")
			return nil
		}
		if err := confirm(root.Base(), stdio); err != nil {
			return err
		}
	}
	// 4. systemd over D-Bus, connected on first use.
	sd := systemdconn.For(ctx, root.Prefix(), f.SystemdBus)
	defer sd.Close()
	// The resetting unit runs a copy of this binary.
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("path of this binary: %w", err)
	}
	d := reset.Deps{Root: root, Log: log, Systemd: sd, Sys: hostprep.ExecSystem{Root: root}, Request: request,
		LockWait: f.LockWait, PublishWait: f.PublishWait, Force: f.Force, Resume: f.Resume, Self: self}
	if pauseAt != "" {
		d.Before = reset.PauseHook(pauseAt, func(s string) {
			fmt.Fprintf(stdio.Stdout, "paused before %s (pid %d)\n", s, os.Getpid())
		})
	}
	// 5. Lock, record, steps.
	res, err := reset.Run(ctx, d)
	if err != nil {
		return err
	}
	switch {
	case res.HandedOver:
		fmt.Fprintf(stdio.Stdout, "reset request %s handed over to kubeslot-resetting.service\n", res.RequestID)
	case res.Nothing && f.Resume:
		fmt.Fprintln(stdio.Stdout, "no reset under way")
	case res.Nothing && request:
		fmt.Fprintln(stdio.Stdout, "no reset request to serve: nothing was changed")
	case res.Nothing:
		fmt.Fprintln(stdio.Stdout, "nothing to reset: no installation owns this host")
	default:
		fmt.Fprintf(stdio.Stdout, "kubeslot removed from this host (installation %s) in %s\n", res.InstallID, time.Since(t0).Round(time.Millisecond))
		log.Info("reset finished", "install_id", res.InstallID, "resumed", res.Resumed, "request", res.RequestID,
			"took", time.Since(t0).Round(time.Millisecond))
	}
	return nil
}

// confirm asks on stdin; only "yes" goes on.
func confirm(base string, stdio cli.IO) error {
	fmt.Fprintf(stdio.Stdout, "This removes kubeslot from this host: its node, units, %s and every host change it made.\n"+
		"(kubeslot-resetter --dry-run lists them.) Type yes to go on: ", base)
	line, err := bufio.NewReader(stdio.Stdin).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return exitcode.UsageError(fmt.Errorf("read the confirmation: %w", err))
	}
	switch strings.TrimSpace(line) {
	case "yes":
		return nil
	case "":
		if errors.Is(err, io.EOF) {
			return exitcode.UsageError(errors.New("no confirmation on stdin: pass --yes to reset without asking; nothing was changed"))
		}
	}
	return exitcode.UsageError(errors.New("not confirmed: nothing was changed"))
}
