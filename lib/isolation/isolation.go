// Package isolation says how a slot's node runs on the host. It defines the
// isolation Mode, the Backend interface (one configuration's node in a slot:
// provision, configure, start, stop, remove, exec, kubelet health), the node
// Operator interface (lifecycle hooks, restart in place), and the
// mode composition table: the one place that maps every mode the agent can
// operate to its backend factory, its node operator and the names of its
// host units (the unit that runs a slot's node, its boot links), which the
// stages ask of the Mode instead of spelling them.
//
// Imported by the stage packages (lib/bootstrap, lib/repave, lib/reset,
// lib/watcher); the mode packages (lib/isolation/nspawn) are imported only
// here.
package isolation

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
	"github.com/kubeslot/kubeslot/lib/isolation/nspawn"
	"github.com/kubeslot/kubeslot/lib/state"
)

// Mode is an isolation mode. The empty mode means DefaultMode.
type Mode string

// Modes this release knows. A new mode is a constant here, an entry in the
// table below, and its name in config.Modes.
const (
	ModeNspawn  Mode = nspawn.Mode
	DefaultMode      = ModeNspawn
)

// Normal returns m with the empty mode replaced by DefaultMode.
func (m Mode) Normal() Mode {
	if m == "" {
		return DefaultMode
	}
	return m
}

// Valid reports whether the composition table has m (after Normal).
func (m Mode) Valid() bool {
	_, ok := table[m.Normal()]
	return ok
}

// String is the mode's name, "nspawn" for the empty mode.
func (m Mode) String() string { return string(m.Normal()) }

// ParseMode checks s (a configuration's or an applied configuration's
// isolation mode) and returns it normalised; the error names the value and
// the known modes.
func ParseMode(s string) (Mode, error) {
	m := Mode(s).Normal()
	if !m.Valid() {
		return "", fmt.Errorf("isolation mode %q: not one this release can operate (known: %s)", s, strings.Join(Modes(), ", "))
	}
	return m, nil
}

// Modes lists the modes of the composition table, sorted.
func Modes() []string {
	out := make([]string, 0, len(table))
	for m := range table {
		out = append(out, string(m))
	}
	sort.Strings(out)
	return out
}

// Aliases of the dependency types, so that callers need only this package.
type (
	Deps        = hostapi.Deps
	Settings    = hostapi.Settings
	SystemdConn = hostapi.Systemd
	Runner      = hostapi.Runner
	Machine     = hostapi.Machine
)

// ErrNoMachine: machined knows no machine of that name.
var ErrNoMachine = hostapi.ErrNoMachine

// Backend runs one configuration's node in a slot. It is bound to that
// configuration and the host root; every method is idempotent and bounded
// by ctx (and the configuration's timeouts).
type Backend interface {
	// Provision builds the slot's rootfs from the verified artifact cache
	// and installs the artifacts; a half-built slot is never visible.
	Provision(ctx context.Context, slot string) error
	// Configure writes the node's files into the rootfs and the host-side
	// settings of the slot (journalled before they are created).
	Configure(ctx context.Context, slot string) error
	// Boot boots the slot's node and waits until it has booted, without
	// starting containerd and the kubelet unless the slot serves already
	// (a warm standby: the old slot's node keeps serving meanwhile).
	Boot(ctx context.Context, slot string) error
	// Start boots the slot's node (Boot), marks the slot as the serving
	// one and starts containerd and the kubelet inside.
	Start(ctx context.Context, slot string) error
	// Stop stops kubelet, containerd, then the node, gracefully and
	// bounded; a node that does not run is fine.
	Stop(ctx context.Context, slot string) error
	// Remove deletes the slot's rootfs and host-side settings; absent is
	// fine. It refuses while the node runs.
	Remove(ctx context.Context, slot string) error
	// Exec runs a short command inside the running node.
	Exec(ctx context.Context, slot string, args ...string) ([]byte, error)
	// KubeletHealthy asks the node's kubelet for its health once.
	KubeletHealthy(ctx context.Context, slot string) error
	// KubeletStartedAt returns when the kubelet that runs in the slot's
	// node now was started: a Node status older than that was posted by
	// another kubelet (the old slot's, or a crashed one's).
	KubeletStartedAt(ctx context.Context, slot string) (time.Time, error)
	// KubeletVersion is the release the slot's kubelet binary reports
	// ("1.37.2"), asked of the running node.
	KubeletVersion(ctx context.Context, slot string) (string, error)
}

// CRIEndpoint is a Backend whose node's container runtime the host can
// reach over the CRI (lib/cri): a repave or restart asks it to remove the
// pod sandboxes the stopped run left dead while the new kubelet starts.
type CRIEndpoint interface {
	// CRISocket is the local path, as this process reaches it, of the CRI
	// socket of slot's running node.
	CRISocket(ctx context.Context, slot string) (string, error)
}

// RuntimeHandover is a Backend that can hand the container runtime over to
// a warm slot while the old slot's kubelet still serves: a repave's switch
// then stops the old kubelet only once the target's runtime is up, so the
// runtime's stop and start are out of the node's downtime (lib/repave).
type RuntimeHandover interface {
	// Warm reports whether slot's machine runs: booted by a standby, or
	// serving.
	Warm(ctx context.Context, slot string) bool
	// StopRuntime stops the container runtime of slot's running node; its
	// kubelet keeps serving and its pods keep running.
	StopRuntime(ctx context.Context, slot string) error
	// StartRuntime marks slot's running node as the serving one and starts
	// its container runtime alone, not its kubelet.
	StartRuntime(ctx context.Context, slot string) error
}

// KubeletPatcher is a Backend that can replace the kubelet of a slot's
// node in place, for a Kubernetes patch release (lib/repave's in-place
// path): no new slot, the containers keep running.
type KubeletPatcher interface {
	// PatchKubelet installs the kubelet of the backend's configuration into
	// slot's node and renders the node's files for it; nothing is stopped
	// (the node's restart, Operator.RestartNode, starts the new kubelet).
	// Anything but the kubelet differing from the slot's build is refused.
	// Idempotent.
	PatchKubelet(ctx context.Context, slot string) error
}

// Operator is the node lifecycle of one mode. An operator implements its
// mode itself and never embeds another mode's operator: modes differ in
// exactly these steps.
type Operator interface {
	// EnsureHooks installs the mode's lifecycle hooks (for nspawn: the
	// slots' settings and unit drop-ins) without restarting running
	// services; systemd is reloaded only when something changed.
	EnsureHooks(ctx context.Context) error
	// RestartNode restarts the slot's node in place, never the host, and
	// waits for its kubelet's health. down is when the node stopped
	// serving (its kubelet's stop began): the start of its downtime.
	RestartNode(ctx context.Context, slot string) (down time.Time, err error)
}

// Entry is one row of the composition table.
type Entry struct {
	NewBackend  func(Deps) (Backend, error)
	NewOperator func(Deps) (Operator, error)
	Units       Units
}

// Link is an enable link of the host's systemd: Path, the host path of the
// link (under /etc/systemd/system), names Unit, a unit file the host's
// systemd ships.
type Link struct{ Path, Unit string }

// Units names the host units that run a mode's node machines and start them
// at host boot. The stages make, move and remove those links themselves
// (each journalled first) and ask the mode for the names.
type Units struct {
	// Machine is the host unit that runs slot's node.
	Machine func(slot string) string
	// Boot is the enable link that starts slot's node at host boot.
	Boot func(slot string) Link
	// BootTarget is the enable link that has the host's boot reach the
	// Boot links (none when Path is empty).
	BootTarget Link
	// Owns reports whether a unit path kubeslot journalled (a file, a
	// drop-in, an enable link) belongs to the mode's machines.
	Owns func(unitPath string) bool
	// RootfsMount is the host unit that mounts slot's rootfs when it is
	// layered ("" when the mode has none): stopped after the machine.
	RootfsMount func(slot string) string
	// Mechanism reads how slot's rootfs is made ("overlay" or "copy", and
	// why no fast path was taken); found is false without a rootfs.
	Mechanism func(root *hostroot.Root, slot string) (mechanism, noFastPath string, found bool, err error)
	// Probe is the preflight of the rootfs mechanism a slot build would
	// choose on this host, and why not the fast path.
	Probe func(root *hostroot.Root) (mechanism, noFastPath string)
}

// table is THE mode composition table.
var table = map[Mode]Entry{
	ModeNspawn: {
		NewBackend: func(d Deps) (Backend, error) {
			b, err := nspawn.New(d)
			if err != nil {
				return nil, err
			}
			return b, nil
		},
		NewOperator: func(d Deps) (Operator, error) {
			o, err := nspawn.NewOperator(d)
			if err != nil {
				return nil, err
			}
			return o, nil
		},
		Units: Units{
			Machine: nspawn.UnitName,
			Boot: func(slot string) Link {
				return Link{Path: nspawn.BootLink(slot), Unit: nspawn.UnitTemplate}
			},
			BootTarget:  Link{Path: nspawn.BootTargetLink(), Unit: nspawn.BootTarget},
			Owns:        nspawn.OwnsUnitPath,
			RootfsMount: nspawn.MountUnitName,
			Mechanism:   nspawn.ReadMechanism,
			Probe:       nspawn.Probe,
		},
	},
}

// units is m's row's Units. A mode the table does not have is a bug in the
// caller, which got it through ParseMode, AppliedMode or For.
func (m Mode) units() Units {
	e, ok := table[m.Normal()]
	if !ok {
		panic(fmt.Sprintf("isolation mode %q: not in the composition table", string(m)))
	}
	return e.Units
}

// MachineUnit is the host unit that runs slot's node in mode m.
func (m Mode) MachineUnit(slot string) string { return m.units().Machine(slot) }

// RootfsMountUnit is the host unit that mounts slot's rootfs in mode m
// when the slot is layered; "" when m has none.
func (m Mode) RootfsMountUnit(slot string) string {
	if f := m.units().RootfsMount; f != nil {
		return f(slot)
	}
	return ""
}

// SlotMechanism reads how slot's rootfs is made in mode m (see
// Units.Mechanism); found is false when the slot has none or m cannot say.
func (m Mode) SlotMechanism(root *hostroot.Root, slot string) (mechanism, noFastPath string, found bool, err error) {
	if f := m.units().Mechanism; f != nil {
		return f(root, slot)
	}
	return "", "", false, nil
}

// ProbeRootfs says which rootfs mechanism a slot build in mode m would
// choose on this host, and why not the fast path; "" when m has no choice.
func (m Mode) ProbeRootfs(root *hostroot.Root) (mechanism, noFastPath string) {
	if f := m.units().Probe; f != nil {
		return f(root)
	}
	return "", ""
}

// BootLink is the enable link that starts slot's node in mode m at host
// boot.
func (m Mode) BootLink(slot string) Link { return m.units().Boot(slot) }

// BootTargetLink is the enable link that has the host's boot reach m's
// BootLinks; its Path is empty when m needs none.
func (m Mode) BootTargetLink() Link { return m.units().BootTarget }

// OwnsMachineUnit reports whether a unit path kubeslot journalled belongs
// to the node machines of some mode of the table: reset removes those with
// the slots' settings.
func OwnsMachineUnit(unitPath string) bool {
	for _, e := range table {
		if e.Units.Owns(unitPath) {
			return true
		}
	}
	return false
}

// For builds mode's backend and node operator over deps. deps.Config must
// be for the same mode: a backend bound to another mode's configuration is
// a bug in the caller.
func For(mode Mode, deps Deps) (Backend, Operator, error) {
	m, err := ParseMode(string(mode))
	if err != nil {
		return nil, nil, err
	}
	if deps.Config != nil {
		if cm := Mode(deps.Config.Isolation.Mode).Normal(); cm != m {
			return nil, nil, fmt.Errorf("isolation mode %q requested, but the configuration has isolation.mode %q", m, cm)
		}
	}
	e := table[m]
	b, err := e.NewBackend(deps)
	if err != nil {
		return nil, nil, fmt.Errorf("isolation mode %s: %w", m, err)
	}
	o, err := e.NewOperator(deps)
	if err != nil {
		return nil, nil, fmt.Errorf("isolation mode %s: %w", m, err)
	}
	return b, o, nil
}

// ForConfig is For with the mode of deps.Config.
func ForConfig(deps Deps) (Backend, Operator, error) {
	if deps.Config == nil {
		return nil, nil, fmt.Errorf("isolation: no configuration")
	}
	return For(Mode(deps.Config.Isolation.Mode), deps)
}

// NewApplied is the applied configuration of slot for cfg, recording the
// isolation mode the slot is applied with (and the fingerprint), for
// state.Store.SaveApplied. The bootstrap and the repaver write it at their
// commit point; a later stage picks the slot's operator from its Mode
// (AppliedMode), never from a newer configuration.
func NewApplied(slot string, cfg *config.Config, agentVersion string, at time.Time) (*state.Applied, error) {
	m, err := ParseMode(cfg.Isolation.Mode)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(cfg.Isolation.Slots, slot) {
		return nil, fmt.Errorf("applied configuration: slot %q is not one of %v", slot, cfg.Isolation.Slots)
	}
	return &state.Applied{
		Slot: slot, Mode: string(m), Fingerprint: cfg.Fingerprint(),
		AgentVersion: agentVersion, AppliedAt: at.UTC(), Config: cfg,
	}, nil
}

// AppliedMode is the mode a slot was applied with (the empty mode of an
// older record means DefaultMode); an unknown mode is an error naming it.
func AppliedMode(a *state.Applied) (Mode, error) {
	m, err := ParseMode(a.Mode)
	if err != nil {
		return "", fmt.Errorf("applied configuration of slot %s: %w", a.Slot, err)
	}
	return m, nil
}
