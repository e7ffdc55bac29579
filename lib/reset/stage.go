package reset

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

	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostprep"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/systemdconn"
)

// Command is one run of the resetter binary, as its flags and environment
// asked (cmd/kubeslot-resetter parses and checks them).
type Command struct {
	Root       *hostroot.Root
	SystemdBus string // --systemd-bus; "" is the host's systemd
	// Request, Force, Resume: Deps'. Yes skips the confirmation; DryRun
	// only lists what would be removed.
	Request, Yes, DryRun, Force, Resume bool
	// LockWait and PublishWait: Deps'.
	LockWait, PublishWait time.Duration
	// Getenv reads the test hook KUBESLOT_TEST_PAUSE_AT (PauseFromEnv).
	Getenv func(string) string
	Stdin  io.Reader
	Stdout io.Writer
	Log    *slog.Logger
	// Started is when the binary started, for the "in" of the summary.
	Started time.Time
}

// Run is the whole stage: --dry-run's plan; by hand, the plan and the
// confirmation; then lock, record and steps (Run) and a summary on Stdout.
func (c Command) Run(ctx context.Context) error {
	root, log := c.Root, c.Log
	pause, err := PauseFromEnv(c.Getenv, c.Stdout)
	if err != nil {
		return exitcode.UsageError(err)
	}
	if c.DryRun {
		_, err := Plan(root, c.Stdout, c.Force)
		return err
	}
	// By hand: show the plan and ask (not to finish one under way).
	if !c.Request && !c.Yes && !c.Resume {
		// A forced reset shows its plan (what is salvaged and what is
		// lost) before asking.
		planOut := io.Discard
		if c.Force {
			planOut = c.Stdout
		}
		found, err := Plan(root, planOut, c.Force)
		if err != nil {
			return err
		}
		if !found {
			fmt.Fprintln(c.Stdout, "nothing to reset: no installation owns this host")
			return nil
		}
		if err := confirm(root.Base(), c.Stdin, c.Stdout); err != nil {
			return err
		}
	}
	// systemd over D-Bus, connected on first use.
	sd := systemdconn.For(ctx, root.Prefix(), c.SystemdBus)
	defer sd.Close()
	// The resetting unit runs a copy of this binary.
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("path of this binary: %w", err)
	}
	d := Deps{Root: root, Log: log, Systemd: sd, Sys: hostprep.ExecSystem{Root: root}, Request: c.Request,
		LockWait: c.LockWait, PublishWait: c.PublishWait, Force: c.Force, Resume: c.Resume, Self: self, Before: pause}
	res, err := Run(ctx, d)
	if err != nil {
		return err
	}
	took := time.Since(c.Started).Round(time.Millisecond)
	switch {
	case res.HandedOver:
		fmt.Fprintf(c.Stdout, "reset request %s handed over to kubeslot-resetting.service\n", res.RequestID)
	case res.Nothing && c.Resume:
		fmt.Fprintln(c.Stdout, "no reset under way")
	case res.Nothing && c.Request:
		fmt.Fprintln(c.Stdout, "no reset request to serve: nothing was changed")
	case res.Nothing:
		fmt.Fprintln(c.Stdout, "nothing to reset: no installation owns this host")
	default:
		fmt.Fprintf(c.Stdout, "kubeslot removed from this host (installation %s) in %s\n", res.InstallID, took)
		log.Info("reset finished", "install_id", res.InstallID, "resumed", res.Resumed, "request", res.RequestID, "took", took)
	}
	return nil
}

// confirm asks on in; only "yes" goes on.
func confirm(base string, in io.Reader, out io.Writer) error {
	fmt.Fprintf(out, "This removes kubeslot from this host: its node, units, %s and every host change it made.\n"+
		"(kubeslot-resetter --dry-run lists them.) Type yes to go on: ", base)
	line, err := bufio.NewReader(in).ReadString('\n')
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
