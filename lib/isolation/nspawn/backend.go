// Package nspawn is the nspawn isolation backend: a slot's node is a
// systemd-nspawn machine named after the slot, booted from the rootfs under
// /var/lib/machines/<slot> by the host's systemd-nspawn@<slot>.service, in
// the host's network namespace. It implements lib/isolation's Backend and
// Operator; stage binaries reach it through lib/isolation's composition
// table, never directly.
//
// Host files it owns, each journalled in the ownership record before it is
// created: the slot rootfs (and its ".<slot>.partial" staging directory),
// a layered slot's layers (".<slot>.layers", overlay.go) and mount unit
// var-lib-machines-<slot>.mount, /etc/systemd/nspawn/<slot>.nspawn and the
// drop-in /etc/systemd/system/systemd-nspawn@<slot>.service.d/kubeslot.conf.
package nspawn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
)

// Mode is the isolation mode this package implements.
const Mode = "nspawn"

// pollInterval is how often WaitKubeletHealthy looks again: a local
// healthz GET, inside a restart's downtime, which ends when the restart's
// verify sees the Node Ready after it (200 ms cost 100 ms on average there).
const pollInterval = 50 * time.Millisecond

// Backend runs one configuration's node in nspawn machines. Its methods are
// idempotent and bounded by their context and the configuration's timeouts.
// It is not safe for concurrent use on the same slot; stages serialise
// through the installation lock.
type Backend struct {
	d        hostapi.Deps
	cfg      *config.Config
	root     *hostroot.Root
	log      *slog.Logger
	identity string // host path of the node identity directory
	node     nodeconfig.Options
	http     *http.Client
	// mount makes the trial overlay mount that chooses a slot's rootfs
	// mechanism; nil (a root prefix other than "/") chooses the copy.
	mount mounter
}

// New binds a backend to d. It validates the dependencies and the
// configuration, and checks that the configuration is for this mode.
func New(d hostapi.Deps) (*Backend, error) {
	if err := d.Check(); err != nil {
		return nil, fmt.Errorf("nspawn backend: %w", err)
	}
	if m := d.Config.Isolation.Mode; m != Mode && m != "" {
		return nil, fmt.Errorf("nspawn backend: configuration has isolation.mode %q", m)
	}
	identity := d.Identity
	if identity == "" {
		identity = d.Root.HostPath(hostroot.IdentityDir)
	}
	if !path.IsAbs(identity) || path.Clean(identity) != identity || identity == "/" || strings.ContainsAny(identity, ": \t\n\\") {
		return nil, fmt.Errorf("nspawn backend: identity directory %q: want a clean absolute path without ':', '\\' or spaces (it goes into a Bind= line)", identity)
	}
	s := d.Settings
	b := &Backend{
		d: d, cfg: d.Config, root: d.Root, log: d.Logger().With("isolation", Mode), identity: identity,
		node: nodeconfig.Options{
			KubeletPort: s.KubeletPort, HealthzPort: s.HealthzPort, NodeIP: s.NodeIP,
			Cgroups:       nodeconfig.DetectCgroups(d.Root),
			OwnContainerd: d.Config.Artifacts.Containerd != nil,
			LoopbackCNI:   s.LoopbackCNI, Snapshotter: s.Snapshotter, RestrictOOMScoreAdj: s.RestrictOOMScoreAdj,
			CgroupV1Writable: s.CgroupV1Writable,
		},
		// No proxy: the kubelet's healthz is on this host's loopback.
		http: &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}},
	}
	if d.Root.Prefix() == "/" {
		b.mount = sysMounter{}
	}
	if err := nodeconfig.Check(d.Config, b.node); err != nil {
		// Labels the kubelet refuses, bad ports: say so before anything changes.
		return nil, fmt.Errorf("nspawn backend: %w", err)
	}
	return b, nil
}

// Paths of a slot, as host paths.
func rootfsPath(slot string) string  { return path.Join(hostroot.MachinesDir, slot) }
func partialPath(slot string) string { return path.Join(hostroot.MachinesDir, "."+slot+".partial") }
func settingsPath(slot string) string {
	return path.Join(hostroot.NspawnDir, slot+".nspawn")
}
func unitName(slot string) string   { return "systemd-nspawn@" + slot + ".service" }
func dropInDir(slot string) string  { return path.Join(hostroot.UnitDir, unitName(slot)+".d") }
func dropInPath(slot string) string { return path.Join(dropInDir(slot), dropInName) }

const dropInName = "kubeslot.conf"

// The host units of the machines. The stages do not use these names
// directly: they ask lib/isolation's mode (Mode.MachineUnit, Mode.BootLink,
// Mode.BootTargetLink, OwnsMachineUnit), whose composition table maps the
// nspawn mode to them.
const (
	// UnitTemplate is the unit file, shipped by the host's systemd, that
	// every slot's machine unit is an instance of.
	UnitTemplate = "systemd-nspawn@.service"
	// BootTarget is the target whose wants start the machines at host
	// boot, as `machinectl enable` does.
	BootTarget = "machines.target"
)

// UnitName is the host unit that runs slot's node machine.
func UnitName(slot string) string { return unitName(slot) }

// BootLink is the host path of the enable link that starts slot's machine
// at host boot: its unit wanted by BootTarget, naming UnitTemplate.
func BootLink(slot string) string {
	return path.Join(hostroot.UnitDir, BootTarget+".wants", unitName(slot))
}

// BootTargetLink is the host path of the enable link that has
// multi-user.target want BootTarget, naming BootTarget.
func BootTargetLink() string {
	return path.Join(hostroot.UnitDir, "multi-user.target.wants", BootTarget)
}

// OwnsUnitPath reports whether a unit path kubeslot journalled belongs to
// the machines: a file or drop-in of a slot's machine unit, its boot link,
// a link to BootTarget (not the target's own unit file), or a slot's
// rootfs mount unit.
func OwnsUnitPath(p string) bool {
	link := path.Dir(p) != hostroot.UnitDir
	mount := !link && strings.HasPrefix(path.Base(p), escapePath(hostroot.MachinesDir)+"-") && strings.HasSuffix(p, ".mount")
	return strings.Contains(p, "/systemd-nspawn@") || link && path.Base(p) == BootTarget || mount
}

// checkSlot refuses a slot the configuration does not name: a typo must
// not create a third machine.
func (b *Backend) checkSlot(slot string) error {
	if !slices.Contains(b.cfg.Isolation.Slots, slot) {
		return fmt.Errorf("slot %q: not one of the configured slots %v (isolation.slots)", slot, b.cfg.Isolation.Slots)
	}
	return nil
}

// local resolves a host path for reading, or for creating a directory.
func (b *Backend) local(hostPath string) (string, error) { return b.root.Resolve(hostPath) }

// slotDir resolves a slot directory (a rootfs or its staging tree) under
// /var/lib/machines, refusing a link in its place (hostroot.ErrLink): a
// slot is removed and replaced whole, and a link would have that done to
// the tree it names.
func (b *Backend) slotDir(hostPath string) (string, error) { return b.root.Entry(hostPath) }

// localEntry resolves a host path's parent only: for a file that is
// replaced or removed, a link at its place is itself replaced, never
// followed (the journal recorded the link, not its target).
func (b *Backend) localEntry(hostPath string) (string, error) {
	dir, err := b.root.Resolve(path.Dir(hostPath))
	if err != nil {
		return "", err
	}
	return path.Join(dir, path.Base(hostPath)), nil
}

// nodeEnv is the whole environment of commands run in a node.
var nodeEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"LANG=C.UTF-8", "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0", "TERM=dumb",
}

// Exec runs args inside the running node of slot (nsenter into all the
// namespaces of the machine's init, with a fixed environment) and returns
// the combined output. The process is not supervised by the node's systemd:
// use it for short commands (systemctl, cat), not for services.
func (b *Backend) Exec(ctx context.Context, slot string, args ...string) ([]byte, error) {
	if err := b.checkSlot(slot); err != nil {
		return nil, err
	}
	if len(args) == 0 || args[0] == "" || strings.ContainsRune(args[0], '=') {
		return nil, fmt.Errorf("exec in slot %s: want a command name first, got %q", slot, args)
	}
	pid, err := b.leader(ctx, slot)
	if err != nil {
		return nil, fmt.Errorf("exec in slot %s: %w", slot, err)
	}
	argv := append([]string{"-t", strconv.Itoa(pid), "-a", "env", "-i"}, nodeEnv...)
	return b.d.Exec.Run(ctx, "nsenter", append(argv, args...)...)
}

// leader is the host PID of the init of slot's running machine: what
// nsenter enters (Exec) and whose /proc/PID/root is the node's root
// (CRISocket).
func (b *Backend) leader(ctx context.Context, slot string) (int, error) {
	m, err := b.d.Systemd.Machine(ctx, slot)
	if err != nil {
		return 0, notRunning(slot, err)
	}
	if m.Leader <= 0 {
		return 0, fmt.Errorf("machine is %s with no leader process yet", m.State)
	}
	return m.Leader, nil
}

func notRunning(slot string, err error) error {
	if errors.Is(err, hostapi.ErrNoMachine) {
		return fmt.Errorf("the node of slot %s is not running: %w", slot, err)
	}
	return err
}

// healthzBody bounds what is read of a healthz answer.
const healthzBody = 4 << 10

// KubeletHealthy asks the kubelet of slot's node for /healthz on the
// loopback address. The slot's machine must be running: the nodes of both
// slots would answer on the same port, and only one runs at a time.
func (b *Backend) KubeletHealthy(ctx context.Context, slot string) error {
	if err := b.checkSlot(slot); err != nil {
		return err
	}
	if _, err := b.d.Systemd.Machine(ctx, slot); err != nil {
		return fmt.Errorf("kubelet health of slot %s: %w", slot, notRunning(slot, err))
	}
	_, port := b.node.Ports()
	url := "http://127.0.0.1:" + strconv.Itoa(port) + "/healthz"
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("kubelet health of slot %s: %w", slot, err)
	}
	resp, err := b.http.Do(req)
	if err != nil {
		return fmt.Errorf("kubelet health of slot %s: %w", slot, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, healthzBody))
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != "ok" {
		return fmt.Errorf("kubelet health of slot %s: %s answered %d: %s", slot, url, resp.StatusCode, hostapi.Tail(body, 512))
	}
	return nil
}

// WaitKubeletHealthy polls KubeletHealthy until it succeeds, bounded by
// ctx and timeouts.node_ready; the error carries the last failure.
func (b *Backend) WaitKubeletHealthy(ctx context.Context, slot string) error {
	bound := b.cfg.Timeouts.NodeReady.Duration
	ctx, cancel := context.WithTimeoutCause(ctx, bound,
		fmt.Errorf("kubelet of slot %s not healthy within %s (timeouts.node_ready)", slot, bound))
	defer cancel()
	t0 := time.Now()
	for {
		err := b.KubeletHealthy(ctx, slot)
		if err == nil {
			b.log.Info("kubelet healthy", "slot", slot, "waited", time.Since(t0).Round(time.Millisecond))
			return nil
		}
		if cerr := sleep(ctx, pollInterval); cerr != nil {
			return fmt.Errorf("%w; last: %v", cerr, err)
		}
	}
}

// sleep waits d or until ctx is done, returning its cause then.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// nodeDialBound bounds connecting to a node's systemd directly.
const nodeDialBound = 5 * time.Second

// nodeSystemd reaches the systemd of slot's running node: directly
// (Deps.Node, no process started), or, without it or when that fails,
// through systemctl run in the node (execNode). The caller closes it.
func (b *Backend) nodeSystemd(ctx context.Context, slot string) hostapi.NodeSystemd {
	if b.d.Node != nil {
		pid, err := b.leader(ctx, slot)
		if err == nil {
			dctx, cancel := context.WithTimeout(ctx, nodeDialBound)
			var n hostapi.NodeSystemd
			n, err = b.d.Node(dctx, pid)
			cancel()
			if err == nil {
				return n
			}
		}
		b.log.Warn("could not reach the node's systemd directly; running systemctl in the node", "slot", slot, "err", err)
	}
	return execNode{b: b, slot: slot}
}

// execNode is a node's systemd reached by running systemctl in the node
// (Backend.Exec): the fallback of nodeSystemd.
type execNode struct {
	b    *Backend
	slot string
}

func (e execNode) StartUnits(ctx context.Context, names ...string) error {
	return e.systemctl(ctx, append([]string{"start"}, names...)...)
}

func (e execNode) StopUnits(ctx context.Context, names ...string) error {
	return e.systemctl(ctx, append([]string{"stop"}, names...)...)
}

func (e execNode) Halt(ctx context.Context) error { return e.systemctl(ctx, "--force", "halt") }

func (e execNode) Close() {}

func (e execNode) systemctl(ctx context.Context, args ...string) error {
	_, err := e.b.Exec(ctx, e.slot, append([]string{"systemctl"}, args...)...)
	return err
}
