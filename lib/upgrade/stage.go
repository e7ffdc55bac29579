package upgrade

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/kubeslot/kubeslot/lib/artifact"
	"github.com/kubeslot/kubeslot/lib/buildinfo"
	"github.com/kubeslot/kubeslot/lib/bundle"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/systemdconn"
)

// Bounds of a bundle download.
const (
	maxBundle       = 1 << 30
	downloadTimeout = 10 * time.Minute
)

// Command is one run of the upgrader binary, as its flags and environment
// asked (cmd/kubeslot-upgrader parses and checks them).
type Command struct {
	Root       *hostroot.Root
	SystemdBus string // --systemd-bus; "" is the host's systemd
	// Job is the upgrade (or, with Recover, its Stage and LockWait).
	Job Job
	// Recover is `kubeslot-upgrader recover` (Recover) instead of Run.
	Recover bool
	// Preflight says what the upgrade would do and changes nothing; JSON
	// prints that plan as JSON.
	Preflight, JSON bool
	// Getenv reads the test hook KUBESLOT_TEST_PAUSE_AT (PauseFromEnv) of
	// an upgrade.
	Getenv func(string) string
	Stdout io.Writer
	Log    *slog.Logger
}

// Run is the whole stage: the real collaborators, then the plan
// (Preflight), Recover, or Run (lock, admission, resume or claim, the
// phases, the health gate or the rollback), and a summary on Stdout.
func (c Command) Run(ctx context.Context) error {
	var pause func(context.Context, string) error
	if !c.Recover {
		var err error
		if pause, err = PauseFromEnv(c.Getenv, c.Stdout); err != nil {
			return exitcode.UsageError(err)
		}
	}
	d, closeBus := c.deps(ctx)
	d.Pause = pause
	defer closeBus()
	var res *Result
	var err error
	switch {
	case c.Preflight:
		p, err := PreflightPlan(ctx, d, c.Job)
		if err != nil {
			return err
		}
		if c.JSON {
			return p.WriteJSON(c.Stdout)
		}
		p.WriteText(c.Stdout)
		return nil
	case c.Recover:
		res, err = Recover(ctx, d, c.Job)
	default:
		res, err = Run(ctx, d, c.Job)
	}
	report(c.Stdout, res)
	return err
}

// deps are the real collaborators; systemd over D-Bus on first use.
func (c Command) deps(ctx context.Context) (*Deps, func()) {
	root, log := c.Root, c.Log
	sd := systemdconn.For(ctx, root.Prefix(), c.SystemdBus)
	sd.NoMachined = true
	return &Deps{
		Root: root, Log: log, Requests: requests.New(root), Systemd: sd,
		Fetcher: CacheFetcher{F: &artifact.Fetcher{Root: root, Log: log, MaxSize: maxBundle, Timeout: downloadTimeout}},
		Bundles: BundleFiles{Limits: bundle.Limits{MaxSize: maxBundle}},
		Exec:    ExecRunner{}, Exe: ProcExe, Arch: buildinfo.Arch,
	}, sd.Close
}

// report prints what a run did, one line and the message.
func report(w io.Writer, res *Result) {
	if res == nil {
		return
	}
	fmt.Fprintf(w, "%s", res.Outcome)
	if res.RequestID != "" {
		fmt.Fprintf(w, " %s", res.RequestID)
	}
	if res.FromVersion != "" || res.ToVersion != "" {
		fmt.Fprintf(w, ": %s (%s) -> %s (%s)", res.FromVersion, res.FromRelease, res.ToVersion, res.ToRelease)
	}
	fmt.Fprintf(w, " (took %s", res.Took.Round(time.Millisecond))
	if res.Healthy > 0 {
		fmt.Fprintf(w, ", switch to healthy %s", res.Healthy.Round(time.Millisecond))
	}
	if res.RolledBack > 0 {
		fmt.Fprintf(w, ", switch to rolled back %s", res.RolledBack.Round(time.Millisecond))
	}
	fmt.Fprintln(w, ")")
	if res.Message != "" {
		fmt.Fprintf(w, "  %s\n", res.Message)
	}
}
