// Package hostapi holds what every isolation backend is built from: the
// narrow interfaces over the host's systemd (units over D-Bus, machines over
// machine1) and over running commands, the real command runner, and the
// Deps bundle a backend is bound to. The real Systemd is kubeslot's one
// systemd client, lib/systemdconn.Client.
//
// It is a leaf so that both lib/isolation (the mode composition table) and
// the mode packages (lib/isolation/nspawn) can import it without a cycle.
// Stage binaries use it through lib/isolation's aliases; tests substitute
// fakes for Systemd and Runner.
package hostapi

import (
	"context"
	"errors"
	"log/slog"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

// ErrNoMachine is returned (wrapped) by Systemd.Machine when machined knows
// no machine of that name: the node is not running.
var ErrNoMachine = errors.New("no such machine")

// Machine is what machined reports about a running machine.
type Machine struct {
	Name    string
	State   string // "opening", "running" or "closing"
	Leader  int    // PID of the machine's init, in the host's PID namespace
	Class   string // "container" for nspawn
	Service string // the unit that registered it
}

// Systemd is the part of the host's service manager a backend uses. Every
// method is bounded by ctx. The real implementation is
// lib/systemdconn.Client; lib/systemdconn/sdtest is a fake.
type Systemd interface {
	// StartUnit and StopUnit queue a job (mode "replace") and wait for its
	// result; a result other than "done" is an error naming the unit and
	// the result. A unit systemd does not know is stopped already.
	StartUnit(ctx context.Context, name string) error
	StopUnit(ctx context.Context, name string) error
	// Reload is a daemon-reload; it returns once systemd has reloaded.
	Reload(ctx context.Context) error
	// UnitState returns the unit's ActiveState and SubState ("inactive",
	// "dead" for a unit systemd never loaded).
	UnitState(ctx context.Context, name string) (active, sub string, err error)
	// ResetFailed clears a failed unit's state; a unit that is not failed or
	// not loaded is not an error.
	ResetFailed(ctx context.Context, name string) error
	// Machine asks machined about a machine; ErrNoMachine when it has none.
	Machine(ctx context.Context, name string) (Machine, error)
	// TerminateMachine kills a machine's processes at once (no graceful
	// shutdown): the fallback when stopping its unit did not work.
	TerminateMachine(ctx context.Context, name string) error
}

// NodeSystemd is the service manager inside one running node, reached from
// the host without starting a process in the node (Deps.Node). The backend
// uses it for what sits inside a node's downtime; Close ends the connection.
type NodeSystemd interface {
	// StartUnits and StopUnits queue one job per unit (mode "replace") and
	// wait for all of them, as systemctl start and stop do; a result other
	// than "done" is an error naming the unit. A unit the node's systemd
	// does not know is stopped already.
	StartUnits(ctx context.Context, names ...string) error
	StopUnits(ctx context.Context, names ...string) error
	// Halt halts the node at once, without stopping its units one by one
	// (systemctl --force halt). The node's systemd may close the
	// connection before it answers.
	Halt(ctx context.Context) error
	Close()
}

// DialNode connects to the systemd of the running node whose init is the
// host process leader.
type DialNode func(ctx context.Context, leader int) (NodeSystemd, error)

// Runner runs a command on the host. Run returns the combined output; a
// failure (start error, non-zero exit, ctx done) is an error naming the
// command and quoting the tail of its output, and the output so far is
// returned as well. The real implementation is ExecRunner.
type Runner interface {
	Run(ctx context.Context, name string, args ...string) ([]byte, error)
}

// Settings tune a backend beyond the configuration file. The zero value is
// the production default; tests change what a shared test machine needs.
type Settings struct {
	// KubeletPort and HealthzPort are the kubelet's API and healthz ports
	// on 127.0.0.1; 0 means 10250 and 10248. A test rig whose nodes share
	// the machine's loopback picks free ones.
	KubeletPort, HealthzPort int
	// NodeIP is the kubelet's --node-ip; "" lets the kubelet pick the
	// host's address (the node shares the host's network).
	NodeIP string
	// ReadOnlyNetSysctl keeps /proc/sys/net read-only in the node. By
	// default it is writable (nspawn's SYSTEMD_NSPAWN_API_VFS_WRITABLE=network
	// in the unit environment), so CNI plugins and kube-proxy can set the
	// network sysctls they need. The node shares the host's network
	// namespace, so those are the host's own settings: on a test machine
	// whose network namespace the rig shares, they would be the machine's.
	ReadOnlyNetSysctl bool
	// LoopbackCNI, Snapshotter and RestrictOOMScoreAdj are the test rig's
	// node compromises (lib/nodeconfig.Options says why each exists).
	LoopbackCNI         bool
	Snapshotter         string
	RestrictOOMScoreAdj bool
	CgroupV1Writable    bool
}

// Deps is everything a backend or a node operator is bound to. Root,
// Config, Systemd and Exec are required.
type Deps struct {
	Root *hostroot.Root
	// Config is the validated configuration the slot is (to be) applied
	// with. A repave binds a backend to the target's configuration.
	Config *config.Config
	// Systemd is the host's service manager.
	Systemd Systemd
	// Exec runs host commands (nsenter into a node, for one).
	Exec Runner
	// Node reaches a running node's systemd directly; nil, or a node it
	// cannot reach, and the backend runs systemctl in the node (Exec).
	Node DialNode
	Log  *slog.Logger
	// Identity is the host path of the node identity directory, bound
	// into whichever slot is active; "" means <base>/identity.
	Identity string
	// Record is the ownership record: host changes are journalled in it
	// before they are made. Required by the methods that change the host;
	// the caller holds the installation lock.
	Record *ownership.Record
	// Settings tune the backend; the zero value is the production default.
	Settings Settings
}

// Logger returns d.Log, or a logger that discards when it is nil.
func (d *Deps) Logger() *slog.Logger {
	if d.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return d.Log
}

// Check reports the first missing required dependency and validates the
// configuration.
func (d *Deps) Check() error {
	switch {
	case d.Root == nil:
		return errors.New("isolation deps: Root is required")
	case d.Config == nil:
		return errors.New("isolation deps: Config is required")
	case d.Systemd == nil:
		return errors.New("isolation deps: Systemd is required")
	case d.Exec == nil:
		return errors.New("isolation deps: Exec is required")
	}
	return d.Config.Validate()
}
