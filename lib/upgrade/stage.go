package upgrade

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/kubeslot/kubeslot/lib/artifact"
	"github.com/kubeslot/kubeslot/lib/buildinfo"
	"github.com/kubeslot/kubeslot/lib/bundle"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/stagekit"
)

// Bounds of a bundle download.
const (
	maxBundle       = 1 << 30
	downloadTimeout = 10 * time.Minute
)

// Command is one run of the upgrader binary, as its flags asked.
type Command struct {
	stagekit.Host
	// Stage names the lock holder: the binary, and its subcommand.
	Stage string
	// Recover is `kubeslot-upgrader recover` (Recover) instead of Run.
	Recover bool
	// Bundle and SHA256: an upgrade by hand from a bundle file (--bundle,
	// --sha256).
	Bundle, SHA256 string
	// Preflight says what the upgrade would do and changes nothing; JSON
	// prints that plan as JSON.
	Preflight, JSON bool
	// Bounds of the health gate and of the wait for the lock.
	HealthWindow, HealthTimeout, LockWait time.Duration
	// Config is the operator's configuration file (a host path), read for
	// its [upgrade] table (trustedKeys); "" reads none.
	Config string
}

// EnvRequest is set by the worker unit (lib/requests).
const EnvRequest = "KUBESLOT_REQUEST"

// Run is the whole stage: the job from the flags and the unit's
// environment; the driver's prologue (an upgrade's pause hook); the real
// collaborators, then the plan (Preflight), Recover, or Run (lock,
// admission, resume or claim, the phases, the health gate or the
// rollback), and a summary on Stdout.
func (c Command) Run(ctx context.Context) error {
	j, err := c.job()
	if err != nil {
		return exitcode.UsageError(err)
	}
	spec := stagekit.Spec{Stage: "upgrade", Pausable: Pausable(), NoMachined: true}
	if c.Recover {
		spec.Pausable = nil
	}
	drv, err := stagekit.Start(ctx, c.Host, spec)
	if err != nil {
		return err
	}
	defer drv.Close()
	d := c.deps(drv)
	if !c.Recover {
		d.TrustedKeys, d.TrustedKeysErr = c.trustedKeys(drv.Root)
	}
	var res *Result
	switch {
	case c.Preflight:
		p, err := PreflightPlan(ctx, d, j)
		if err != nil {
			return err
		}
		if c.JSON {
			return p.WriteJSON(c.Stdout)
		}
		p.WriteText(c.Stdout)
		return nil
	case c.Recover:
		res, err = Recover(ctx, d, j)
	default:
		res, err = Run(ctx, d, j)
	}
	report(c.Stdout, res)
	return err
}

// job checks the flags and reads the unit's environment.
func (c Command) job() (Job, error) {
	j := Job{Stage: c.Stage, LockWait: c.LockWait}
	if c.Recover {
		if c.LockWait <= 0 {
			return j, fmt.Errorf("--lock-wait %s: want a positive bound", c.LockWait)
		}
		return j, nil
	}
	j.Bundle, j.SHA256, j.HealthWindow, j.HealthTimeout = c.Bundle, c.SHA256, c.HealthWindow, c.HealthTimeout
	switch r := c.Env(EnvRequest); r {
	case "":
	case string(requests.Upgrade):
		j.Triggered = true
	default:
		return j, fmt.Errorf("%s=%q: the upgrader handles upgrade requests only", EnvRequest, r)
	}
	if c.SHA256 != "" {
		if c.Bundle == "" {
			return j, errors.New("--sha256 goes with --bundle")
		}
		if err := bundle.CheckSHA256(c.SHA256); err != nil {
			return j, fmt.Errorf("--sha256: %w", err)
		}
	}
	if c.JSON && !c.Preflight {
		return j, errors.New("--json goes with --preflight")
	}
	if c.HealthWindow <= 0 || c.HealthTimeout <= c.HealthWindow || c.LockWait <= 0 {
		return j, fmt.Errorf("--health-window %s, --health-timeout %s, --lock-wait %s: want positive bounds, the timeout longer than the window",
			c.HealthWindow, c.HealthTimeout, c.LockWait)
	}
	return j, nil
}

// deps are the real collaborators; systemd over D-Bus on first use.
func (c Command) deps(drv *stagekit.Driver) *Deps {
	root, log := drv.Root, c.Log
	return &Deps{
		Root: root, Log: log, Begin: drv.Begin, Requests: requests.New(root), Systemd: drv.Systemd(),
		Fetcher: CacheFetcher{F: &artifact.Fetcher{Root: root, Log: log, MaxSize: maxBundle, Timeout: downloadTimeout}},
		Bundles: BundleFiles{Limits: bundle.Limits{MaxSize: maxBundle}},
		Exec:    ExecRunner{}, Exe: ProcExe, Arch: buildinfo.Arch, Pause: drv.Pause,
		Signature: FetchSignature,
	}
}

// trustedKeys reads [upgrade] trusted_keys from the configuration file: no
// file is no keys (a host set up without one); a file that cannot be read
// or is invalid is an error that refuses every bundle (Deps.TrustedKeysErr),
// as it may have named keys.
func (c Command) trustedKeys(root *hostroot.Root) ([]string, error) {
	if c.Config == "" {
		return nil, nil
	}
	local, err := root.Resolve(c.Config)
	if err != nil {
		return nil, fmt.Errorf("--config %s: %w", c.Config, err)
	}
	if _, err := os.Stat(local); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	cfg, err := config.Load(local)
	if err != nil {
		return nil, fmt.Errorf("the configuration's [upgrade] table (which bundles to trust) cannot be read: %w", err)
	}
	return cfg.Upgrade.TrustedKeys, nil
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
