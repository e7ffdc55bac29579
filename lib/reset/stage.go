package reset

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostprep"
	"github.com/kubeslot/kubeslot/lib/stagekit"
)

// Command is one run of the resetter binary, as its flags asked.
type Command struct {
	stagekit.Host
	// Force, Resume: Deps'. Yes skips the confirmation; DryRun only lists
	// what would be removed.
	Yes, DryRun, Force, Resume bool
	// LockWait and PublishWait: Deps'.
	LockWait, PublishWait time.Duration
}

// EnvRequest is set by kubeslot-reset.service: serve the pending request.
const EnvRequest = "KUBESLOT_REQUEST"

// Run is the whole stage: whether it serves a request; the driver's
// prologue; --dry-run's plan; by hand, the plan and the confirmation; then
// lock, record and steps (Run) and a summary on Stdout.
func (c Command) Run(ctx context.Context) error {
	request := false
	switch v := c.Env(EnvRequest); v {
	case "":
	case "reset":
		request = true
	default:
		return exitcode.UsageError(fmt.Errorf("%s=%q: want reset or nothing", EnvRequest, v))
	}
	drv, err := stagekit.Start(ctx, c.Host, stagekit.Spec{Stage: "reset", Pausable: StepNames(), Layout: c.layout})
	if err != nil {
		return err
	}
	defer drv.Close()
	root, log := drv.Root, c.Log
	if c.DryRun {
		_, err := Plan(root, c.Stdout, c.Force)
		return err
	}
	// By hand: show the plan and ask (not to finish one under way).
	if !request && !c.Yes && !c.Resume {
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
	// The resetting unit runs a copy of this binary.
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("path of this binary: %w", err)
	}
	d := Deps{Root: root, Log: log, Begin: drv.Begin, Systemd: drv.Systemd(), Sys: hostprep.ExecSystem{Root: root}, Request: request,
		LockWait: c.LockWait, PublishWait: c.PublishWait, Force: c.Force, Resume: c.Resume, Self: self, Before: drv.Pause}
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
	case res.Nothing && request:
		fmt.Fprintln(c.Stdout, "no reset request to serve: nothing was changed")
	case res.Nothing:
		fmt.Fprintln(c.Stdout, "nothing to reset: no installation owns this host")
	default:
		fmt.Fprintf(c.Stdout, "kubeslot removed from this host (installation %s) in %s\n", res.InstallID, took)
		log.Info("reset finished", "install_id", res.InstallID, "resumed", res.Resumed, "request", res.RequestID, "took", took)
	}
	return nil
}

// layout is what another layout version means: exit 78 unless --force. A
// reset must stay possible on a host an older release cannot read (the way
// out of a layout no release at hand understands), but only knowingly: the
// journal and the base are what this release removes, and a newer layout
// may keep things elsewhere that it does not know of.
func (c Command) layout(err error) error {
	if !c.Force {
		return fmt.Errorf("%w (kubeslot-resetter --force resets from what the ownership record still says)", err)
	}
	c.Log.Warn("resetting a host whose layout this release does not understand (--force)", "err", err.Error())
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
