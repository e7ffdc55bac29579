package bootstrap

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostprep"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/release"
	"github.com/kubeslot/kubeslot/lib/sandbox"
	"github.com/kubeslot/kubeslot/lib/systemdconn"
)

// The test and sandbox environment variables are lib/sandbox's; the
// bootstrap records what they say (Deps.Sandbox). They are named here too
// for the bootstrap's callers and tests.
const (
	EnvKubeletPort           = sandbox.EnvKubeletPort
	EnvHealthzPort           = sandbox.EnvHealthzPort
	EnvNodeIP                = sandbox.EnvNodeIP
	EnvReadOnlyNetSysctl     = sandbox.EnvReadOnlyNetSysctl
	EnvHostPrep              = sandbox.EnvHostPrep
	EnvLoopbackCNI           = sandbox.EnvLoopbackCNI
	EnvSnapshotter           = sandbox.EnvSnapshotter
	EnvRestrictOOMScore      = sandbox.EnvRestrictOOMScoreAdj
	EnvCgroupV1Writable      = sandbox.EnvCgroupV1Writable
	EnvSkipSandboxImageCheck = sandbox.EnvSkipSandboxImageCheck
	HostPrepPackagesOnly     = sandbox.HostPrepPackagesOnly
)

// Pausable names what the test hook KUBESLOT_TEST_PAUSE_AT may pause before
// (lib/stagekit), a Deps.Pause: the install checkpoints; the run stops at
// the start of that phase, its checkpoint saved ("complete": before it is
// written), and waits to be killed.
func Pausable() []string {
	var names []string
	for _, cp := range ownership.InstallCheckpoints() {
		names = append(names, string(cp))
	}
	return names
}

// HostPrep is the real Host: lib/hostprep over its ExecSystem.
type HostPrep struct {
	Root *hostroot.Root
	Log  *slog.Logger
	// PackagesOnly restricts the requirements to packages (EnvHostPrep).
	PackagesOnly bool
}

func (h HostPrep) requirements(cfg *config.Config) hostprep.Requirements {
	req := hostprep.DefaultRequirements(cfg.Host.InstallPackages)
	if h.PackagesOnly {
		req = hostprep.Requirements{Software: req.Software, InstallPackages: req.InstallPackages}
	}
	return req
}

// Preflight surveys the host, changing nothing.
func (h HostPrep) Preflight(ctx context.Context, cfg *config.Config) (*hostprep.Plan, error) {
	return hostprep.Preflight(ctx, h.Root, hostprep.ExecSystem{Root: h.Root}, h.requirements(cfg))
}

// Apply prepares the host, journalling each change first.
func (h HostPrep) Apply(ctx context.Context, cfg *config.Config, rec *ownership.Record) error {
	return hostprep.Apply(ctx, h.Root, hostprep.ExecSystem{Root: h.Root}, rec, h.requirements(cfg), h.Log)
}

// ReleaseFromExe is the real Releaser: lib/release, copying from the
// directory of the running binary when current is not usable.
type ReleaseFromExe struct {
	Root *hostroot.Root
	Log  *slog.Logger
}

// Ensure implements Releaser.
func (r ReleaseFromExe) Ensure(ctx context.Context) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("install release: %w", err)
	}
	if p, err := filepath.EvalSymlinks(exe); err == nil {
		exe = p
	}
	_, err = release.Ensure(ctx, r.Root, filepath.Dir(exe), r.Log)
	return err
}

// Isolation returns the production NewIsolation: the composition table
// over the host's systemd and commands, with settings.
func Isolation(root *hostroot.Root, sd isolation.SystemdConn, settings hostapi.Settings, log *slog.Logger) func(*config.Config, *ownership.Record) (isolation.Backend, isolation.Operator, error) {
	return func(cfg *config.Config, rec *ownership.Record) (isolation.Backend, isolation.Operator, error) {
		return isolation.ForConfig(isolation.Deps{Root: root, Config: cfg, Systemd: sd, Exec: hostapi.ExecRunner{}, Node: systemdconn.DialNode,
			Log: log, Record: rec, Settings: settings})
	}
}
