package bootstrap

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostprep"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/release"
	"github.com/kubeslot/kubeslot/lib/state"
)

// Environment variables for tests and sandboxes. A production host sets
// none of them. A rig host shares the test machine's kernel and network
// namespace, so it must keep its hands off what belongs to the machine.
const (
	// EnvKubeletPort, EnvHealthzPort: the node kubelet's API and healthz
	// ports on 127.0.0.1 (hostapi.Settings), when several rigs share a
	// loopback.
	EnvKubeletPort = "KUBESLOT_NODE_KUBELET_PORT"
	EnvHealthzPort = "KUBESLOT_NODE_HEALTHZ_PORT"
	// EnvNodeIP is the kubelet's --node-ip.
	EnvNodeIP = "KUBESLOT_NODE_IP"
	// EnvReadOnlyNetSysctl=1 keeps /proc/sys/net read-only in the node.
	EnvReadOnlyNetSysctl = "KUBESLOT_NODE_READONLY_NET_SYSCTL"
	// EnvHostPrep=packages-only restricts host preparation to checking
	// packages: no kernel modules, sysctls or swap (the machine's own).
	EnvHostPrep = "KUBESLOT_HOSTPREP"
	// EnvPauseAt=<checkpoint> is test-only: the run stops at the start of
	// that phase and waits to be killed.
	EnvPauseAt = "KUBESLOT_TEST_PAUSE_AT"
)

// SettingsFromEnv reads the backend settings of tests and sandboxes from
// the environment alone. Stages use Settings, which starts from the record.
func SettingsFromEnv(getenv func(string) string) (hostapi.Settings, error) {
	sb, err := SandboxFromEnv(state.Sandbox{}, getenv)
	return SandboxSettings(sb), err
}

// SandboxFromEnv returns rec with the environment overriding it: a variable
// that is set replaces the recorded value (KUBESLOT_NODE_READONLY_NET_SYSCTL=0
// and KUBESLOT_HOSTPREP=full turn a recorded setting off).
func SandboxFromEnv(rec state.Sandbox, getenv func(string) string) (state.Sandbox, error) {
	s := rec
	for _, p := range []struct {
		env string
		dst *int
	}{{EnvKubeletPort, &s.KubeletPort}, {EnvHealthzPort, &s.HealthzPort}} {
		if v := getenv(p.env); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 || n > 65535 {
				return rec, fmt.Errorf("%s=%q: want a port number", p.env, v)
			}
			*p.dst = n
		}
	}
	if v := getenv(EnvNodeIP); v != "" {
		s.NodeIP = v
	}
	switch v := getenv(EnvReadOnlyNetSysctl); v {
	case "":
	case "0":
		s.ReadOnlyNetSysctl = false
	case "1":
		s.ReadOnlyNetSysctl = true
	default:
		return rec, fmt.Errorf("%s=%q: want 0 or 1", EnvReadOnlyNetSysctl, v)
	}
	switch v := getenv(EnvHostPrep); v {
	case "":
	case HostPrepPackagesOnly:
		s.HostPrep = v
	case "full":
		s.HostPrep = ""
	default:
		return rec, fmt.Errorf("%s=%q: want %s or full", EnvHostPrep, v, HostPrepPackagesOnly)
	}
	return s, nil
}

// HostPrepPackagesOnly is the value of EnvHostPrep that restricts host
// preparation to packages.
const HostPrepPackagesOnly = "packages-only"

// SandboxSettings are the backend settings of sb.
func SandboxSettings(sb state.Sandbox) hostapi.Settings {
	return hostapi.Settings{KubeletPort: sb.KubeletPort, HealthzPort: sb.HealthzPort, NodeIP: sb.NodeIP,
		ReadOnlyNetSysctl: sb.ReadOnlyNetSysctl}
}

// LoadSandbox returns this host's test and sandbox settings: those the
// bootstrap recorded (<base>/state/sandbox.json), the environment
// overriding. A host without a record (production, or not bootstrapped
// yet) starts from none.
func LoadSandbox(root *hostroot.Root, getenv func(string) string) (state.Sandbox, error) {
	rec, err := state.NewStore(root).LoadSandbox()
	if err != nil {
		return state.Sandbox{}, fmt.Errorf("test and sandbox settings: %w", err)
	}
	return SandboxFromEnv(rec, getenv)
}

// Settings returns the backend settings of a later stage (repaver,
// watcher): LoadSandbox's, as hostapi.Settings.
func Settings(root *hostroot.Root, getenv func(string) string) (hostapi.Settings, error) {
	sb, err := LoadSandbox(root, getenv)
	return SandboxSettings(sb), err
}

// PauseFromEnv reads the KUBESLOT_TEST_PAUSE_AT hook.
func PauseFromEnv(getenv func(string) string) (ownership.Checkpoint, error) {
	v := ownership.Checkpoint(getenv(EnvPauseAt))
	if v == "" {
		return "", nil
	}
	if v.Order() == 0 {
		return "", fmt.Errorf("%s=%q: not an install checkpoint", EnvPauseAt, v)
	}
	return v, nil
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
		req = hostprep.Requirements{Packages: req.Packages, InstallPackages: req.InstallPackages}
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
		return isolation.ForConfig(isolation.Deps{Root: root, Config: cfg, Systemd: sd, Exec: hostapi.ExecRunner{},
			Log: log, Record: rec, Settings: settings})
	}
}

// LazySystemd connects to systemd over D-Bus on first use, so that a run
// refused before it touches the host (invalid configuration, busy lock,
// another installation) never needs the bus. Ctx is the connection's
// lifetime (the process's context): go-systemd and godbus close a
// connection when the context it was dialled with ends, so the dial is
// bounded by DialTimeout separately.
type LazySystemd struct {
	Ctx  context.Context
	mu   sync.Mutex
	conn *hostapi.DBus
	err  error
}

// DialTimeout bounds connecting to systemd.
const DialTimeout = 30 * time.Second

var _ isolation.SystemdConn = (*LazySystemd)(nil)

func (l *LazySystemd) get(ctx context.Context) (*hostapi.DBus, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil || l.err != nil {
		return l.conn, l.err
	}
	life := l.Ctx
	if life == nil {
		life = context.Background()
	}
	type result struct {
		c   *hostapi.DBus
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := hostapi.DialSystemd(life)
		ch <- result{c, err}
	}()
	t := time.NewTimer(DialTimeout)
	defer t.Stop()
	select {
	case r := <-ch:
		l.conn, l.err = r.c, r.err
	case <-t.C:
		l.err = fmt.Errorf("connect to systemd over D-Bus: no answer within %s", DialTimeout)
	case <-ctx.Done():
		// Not sticky: a later call with a live context may dial again.
		return nil, fmt.Errorf("connect to systemd over D-Bus: %w", context.Cause(ctx))
	}
	return l.conn, l.err
}

// Close closes the connection if one was made.
func (l *LazySystemd) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		l.conn.Close()
	}
}

// The methods below implement isolation.SystemdConn over the lazily made
// connection.

// StartUnit starts a unit and waits for its job.
func (l *LazySystemd) StartUnit(ctx context.Context, name string) error {
	c, err := l.get(ctx)
	if err != nil {
		return err
	}
	return c.StartUnit(ctx, name)
}

// StopUnit stops a unit and waits for its job.
func (l *LazySystemd) StopUnit(ctx context.Context, name string) error {
	c, err := l.get(ctx)
	if err != nil {
		return err
	}
	return c.StopUnit(ctx, name)
}

// Reload is a daemon-reload.
func (l *LazySystemd) Reload(ctx context.Context) error {
	c, err := l.get(ctx)
	if err != nil {
		return err
	}
	return c.Reload(ctx)
}

// UnitState returns ActiveState and SubState.
func (l *LazySystemd) UnitState(ctx context.Context, name string) (string, string, error) {
	c, err := l.get(ctx)
	if err != nil {
		return "", "", err
	}
	return c.UnitState(ctx, name)
}

// ResetFailed clears a failed state.
func (l *LazySystemd) ResetFailed(ctx context.Context, name string) error {
	c, err := l.get(ctx)
	if err != nil {
		return err
	}
	return c.ResetFailed(ctx, name)
}

// Machine asks machined about a machine.
func (l *LazySystemd) Machine(ctx context.Context, name string) (hostapi.Machine, error) {
	c, err := l.get(ctx)
	if err != nil {
		return hostapi.Machine{}, err
	}
	return c.Machine(ctx, name)
}

// TerminateMachine kills a machine at once.
func (l *LazySystemd) TerminateMachine(ctx context.Context, name string) error {
	c, err := l.get(ctx)
	if err != nil {
		return err
	}
	return c.TerminateMachine(ctx, name)
}

// ListUnitsByPatterns lists the loaded units matching the glob patterns
// (lib/reset.UnitLister).
func (l *LazySystemd) ListUnitsByPatterns(ctx context.Context, patterns []string) ([]string, error) {
	c, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return c.ListUnitsByPatterns(ctx, patterns)
}
