// Package stagekit is the driver every stage binary's run goes through: it
// owns what each stage needs before its phases and the same in all of them:
// the host root from the flags, the layout check (another layout version:
// exit 78, nothing changed), the test and sandbox settings (lib/sandbox),
// the pause hook (lib/transition), the systemd connection (lib/systemdconn)
// and Begin, the stage prologue (ownership.Begin: the installation lock and
// the stage's admission rule), the only way a stage takes the lock (a
// repocheck test holds to it): the repaver calls it in its Command.Run, the
// bootstrap, resetter and upgrader get it as their Deps.Begin (their unit
// tests give a Driver on a temporary root), and the watcher calls it in
// rounds. A stage's Command.Run reads: input check → Start → its phase
// table; a cmd/ main turns flags into a Command and nothing else.
//
// Imported by the stage packages (lib/bootstrap, lib/repave, lib/reset,
// lib/upgrade, lib/watcher) and lib/cli (Host, which cli.Run hands to a
// main); it imports none of them.
package stagekit

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/sandbox"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/systemdconn"
	"github.com/kubeslot/kubeslot/lib/transition"
)

// Host is what a stage binary's command line and process give its stage
// (cli.Run builds it from the common flags).
type Host struct {
	// RootPrefix and HostRoot are --root-prefix and --host-root.
	RootPrefix, HostRoot string
	// SystemdBus is --systemd-bus; "" is the host's systemd.
	SystemdBus string
	// Getenv reads the process environment: the unit's settings, the
	// sandbox settings' overrides and, in a test build, the test hooks.
	Getenv func(string) string
	Stdin  io.Reader
	Stdout io.Writer
	Log    *slog.Logger
	// Started is when the process started, for the "took" of summaries.
	Started time.Time
}

// Env reads k from the environment ("" without Getenv).
func (h Host) Env(k string) string {
	if h.Getenv == nil {
		return ""
	}
	return h.Getenv(k)
}

// Spec is what differs between the stages' prologues.
type Spec struct {
	// Stage names the stage in the pause hook's messages ("repave").
	Stage string
	// Pausable lists the phases the test hook may pause before; nil: no
	// pause hook.
	Pausable []string
	// Layout, if set, decides what a failed layout check means (the
	// resetter's --force goes past it); nil returns the error (exit 78).
	Layout func(err error) error
	// Input, if set, runs right after the layout check (the bootstrap's
	// configuration): input read only once the layout is known.
	Input func() error
	// Sandbox loads the test and sandbox settings (Driver.Sandbox).
	Sandbox bool
	// NoMachined: the systemd connection never reaches machined.
	NoMachined bool
}

// Driver is a stage's run past its prologue.
type Driver struct {
	Host
	Root *hostroot.Root
	// Sandbox is the host's test and sandbox settings (Spec.Sandbox).
	Sandbox state.Sandbox
	// Pause is the test hook (transition.PauseFromEnv); nil unless a test
	// build was told to pause.
	Pause func(ctx context.Context, name string) error
	// Held is the stage's hold on the host after Begin.
	Held *ownership.Held
	spec Spec
	sd   *systemdconn.Client
}

// Start runs the prologue up to the lock: the host root (a usage error
// when the flags name none that can be used), the layout check, the
// stage's Input, the sandbox settings and the pause hook (usage errors when
// the environment is wrong). Nothing on the host is changed. The caller
// ends with Close.
func Start(ctx context.Context, h Host, s Spec) (*Driver, error) {
	root, err := hostroot.New(h.RootPrefix, h.HostRoot)
	if err != nil {
		return nil, exitcode.UsageError(err)
	}
	// The layout check, before anything changes: another layout version
	// ends the run with exit 78 (hostroot.CheckLayout).
	if err := root.CheckLayout(); err != nil {
		if s.Layout == nil {
			return nil, err
		}
		if err := s.Layout(err); err != nil {
			return nil, err
		}
	}
	if s.Input != nil {
		if err := s.Input(); err != nil {
			return nil, err
		}
	}
	d := &Driver{Host: h, Root: root, spec: s}
	if s.Sandbox {
		if d.Sandbox, err = sandbox.Load(root, h.Env); err != nil {
			return nil, exitcode.UsageError(err)
		}
	}
	if s.Pausable != nil {
		if d.Pause, err = transition.PauseFromEnv(h.Env, s.Stage, s.Pausable, h.Stdout); err != nil {
			return nil, exitcode.UsageError(err)
		}
	}
	d.sd = systemdconn.For(ctx, root.Prefix(), h.SystemdBus)
	d.sd.NoMachined = s.NoMachined
	return d, nil
}

// Begin runs the stage prologue p (ownership.Begin: the installation lock,
// busy → 69, then the stage's admission) and keeps the hold for Close.
func (d *Driver) Begin(ctx context.Context, p ownership.Prologue) (*ownership.Held, error) {
	if p.Log == nil {
		p.Log = d.Log
	}
	held, err := ownership.Begin(ctx, d.Root, p)
	if err != nil {
		return nil, err
	}
	d.Held = held
	return held, nil
}

// Systemd is the stage's systemd client, connected on first use, so that a
// run refused before it touches the host never needs the bus.
func (d *Driver) Systemd() *systemdconn.Client { return d.sd }

// Close releases what the run holds: the lock (if Begin took it) and the
// systemd connection (if one was made).
func (d *Driver) Close() {
	d.sd.Close()
	d.Held.Release()
}
