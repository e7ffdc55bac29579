package nspawn

// The pre-start hook: what a slot's node takes from the host is re-read before every start of its machine, so a
// node booted after the host changed (a new address, another kernel, a device plugged in, a new resolver) starts
// with settings for the host as it is, not as it was when the slot was configured. It runs as the ExecStartPre= of
// systemd-nspawn@<slot>.service (the drop-in, configure.go), through `kubeslot node-hook pre-start <slot>` of the
// current release. Configure writes the same host-dependent parts, so a hook that never ran leaves the settings of
// the last configure.
//
// It takes no lock: it runs inside starts that a stage holding the installation lock waits for (bootstrap, repave,
// restart), and at host boot. So it only rewrites files whose journal entry exists already (reset removes them),
// each by atomic rename, to what the same functions render as Configure does; it never appends to the record.
//
// Failure policy: settings the hook knows are wrong and cannot fix fail the start (exit 1: systemd does not start
// the node); a hook that cannot decide (no record, an address the host does not have yet) lets the node start with
// what is there and says so (exit 0, a warning).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path"
	"regexp"
	"strings"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"

	"golang.org/x/sys/unix"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

// hostBlockMarker starts the host-dependent part of a slot's .nspawn settings, which is their last part: the
// pre-start hook replaces what follows it.
const hostBlockMarker = "# host-dependent settings: re-rendered by the pre-start hook before every node start"

// hostSettings renders the host-dependent lines of the [Files] section (the end of the .nspawn file): binds of
// what the host has now. It is the extension point for devices: a host device the node should see is a line here,
// so it follows the host at every start. has reports whether the host has a path of a type (fs.ModeDir,
// fs.ModeCharDevice).
func hostSettings(has func(p string, typ fs.FileMode) bool) string {
	var f strings.Builder
	f.WriteString(hostBlockMarker + "\n")
	if has(modulesDir, fs.ModeDir) {
		fmt.Fprintf(&f, "BindReadOnly=%s\n", modulesDir)
	}
	if has(kvmDevice, fs.ModeCharDevice) {
		fmt.Fprintf(&f, "Bind=%s\n", kvmDevice)
	}
	return f.String()
}

// hostHasPath reports whether the host has p of the given type.
func hostHasPath(root *hostroot.Root, p string, typ fs.FileMode) bool {
	local, err := root.Resolve(p)
	if err != nil {
		return false
	}
	fi, err := os.Stat(local)
	return err == nil && fi.Mode().Type()&typ == typ
}

// HookDeps is what the pre-start hook reads and writes through.
type HookDeps struct {
	Root *hostroot.Root
	Log  *slog.Logger
	// Record is the ownership record, read only: the hook writes a host file only when it is journalled.
	Record *ownership.Record
	// Settings are the sandbox settings; a NodeIP there is pinned, and the hook leaves the kubelet's address alone.
	Settings hostapi.Settings
	// NodeAddr picks the host's node address; nil is HostNodeAddr.
	NodeAddr func() (netip.Addr, error)
	// AddrWait bounds the wait for the host to have a node address (an interface with the default route); 0 is
	// DefaultAddrWait.
	AddrWait time.Duration
}

// DefaultAddrWait is how long the hook waits for a node address at boot: the node may start before the host's
// network is configured (DHCP), and without one the kubelet is left to pick its own.
const DefaultAddrWait = 20 * time.Second

// HostNodeAddr is the address the kubelet would pick itself without --node-ip and without a DNS name for the node:
// the first global unicast address of the interface that holds the default route (apimachinery's
// ChooseHostInterface, the kubelet's own fallback).
func HostNodeAddr() (netip.Addr, error) {
	ip, err := utilnet.ChooseHostInterface()
	if err != nil {
		return netip.Addr{}, err
	}
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Addr{}, fmt.Errorf("host address %v: not an IP address", ip)
	}
	return a.Unmap(), nil
}

// HookRecord is what the last pre-start hook gave the node (<base>/state/NodeHostFile): the post-start check
// compares the Node with it.
type HookRecord struct {
	Slot string `json:"slot"`
	// NodeIP is the kubelet's node address at this start; "" when the kubelet picks it.
	NodeIP string `json:"nodeIP,omitempty"`
	// Pinned: NodeIP is the sandbox record's, not the host's.
	Pinned bool `json:"pinned,omitempty"`
	// Resolv is the host file the node's resolv.conf was made from ("" none).
	Resolv string `json:"resolv,omitempty"`
	// Kernel is the host's kernel release.
	Kernel string    `json:"kernel,omitempty"`
	At     time.Time `json:"at"`
}

// NodeHostFile is the hook's record in <base>/state.
const NodeHostFile = "node-host.json"

// ErrHookStale is wrapped by a pre-start failure that must keep the node from starting: its settings are known to
// be wrong for this host and could not be fixed. Any other error means the hook could not run.
var ErrHookStale = errors.New("the node's host-dependent settings are stale and could not be rewritten")

var slotRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// PreStart regenerates what slot's node takes from the host, before its machine starts: the host-dependent
// .nspawn settings (kernel modules, devices), the kubelet's node address (unless pinned), the node's resolv.conf.
// Each change is logged; a record of what the node got is left in <base>/state/NodeHostFile.
func PreStart(ctx context.Context, d HookDeps, slot string) (HookRecord, error) {
	rec, _, err := preStart(ctx, d, slot)
	return rec, err
}

// preStart is PreStart; it also returns what it changed (host paths, and node paths in the slot's rootfs).
func preStart(ctx context.Context, d HookDeps, slot string) (HookRecord, []string, error) {
	t0 := time.Now()
	rec := HookRecord{Slot: slot, At: t0.UTC()}
	log := d.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("slot", slot, "hook", "pre-start")
	if !slotRE.MatchString(slot) {
		return rec, nil, fmt.Errorf("pre-start hook: slot %q: not a slot name", slot)
	}
	rootfs, err := d.Root.Entry(rootfsPath(slot))
	if err != nil {
		return rec, nil, fmt.Errorf("pre-start hook: %w", err)
	}
	if _, found, err := readStamp(rootfs); err != nil || !found {
		return rec, nil, fmt.Errorf("pre-start hook: %s is not a provisioned slot rootfs (%v)", rootfsPath(slot), err)
	}
	var uts unix.Utsname
	if unix.Uname(&uts) == nil {
		rec.Kernel = unix.ByteSliceToString(uts.Release[:])
		if !hostHasPath(d.Root, path.Join(modulesDir, rec.Kernel), fs.ModeDir) {
			log.Warn("the running kernel has no modules directory: the node cannot load modules", "kernel", rec.Kernel, "dir", path.Join(modulesDir, rec.Kernel))
		}
	}
	changed, err := rewriteHostBlock(d, log, slot)
	if errors.Is(err, ErrHookStale) {
		return rec, nil, err
	} else if err != nil {
		log.Warn("pre-start hook: the .nspawn settings are left as they are", "err", err)
	}
	files := []nodeconfig.File{}
	ipFile, err := nodeIPFile(ctx, d, log, &rec)
	if err != nil {
		return rec, nil, err
	}
	files = append(files, ipFile)
	resolv, from := nodeResolvConf(d.Root, log)
	rec.Resolv = from
	files = append(files, nodeconfig.File{Path: "/etc/resolv.conf", Data: resolv, Mode: 0o644})
	inNode, err := nodeconfig.WriteFiles(rootfs, files)
	if err != nil {
		return rec, nil, fmt.Errorf("pre-start hook: %w: %w", ErrHookStale, err)
	}
	changed = append(changed, inNode...)
	if err := saveHookRecord(d.Root, rec); err != nil {
		log.Warn("pre-start hook: record not written", "err", err)
	}
	log.Info("pre-start hook done", "node_ip", rec.NodeIP, "pinned", rec.Pinned, "resolv_from", rec.Resolv, "kernel", rec.Kernel, "changed", changed,
		"took", time.Since(t0).Round(time.Millisecond))
	return rec, changed, nil
}

// rewriteHostBlock replaces the host-dependent part of slot's .nspawn settings when the host changed. A file
// without the marker (written by an older release) is left alone: the watcher's EnsureHooks renders it whole.
func rewriteHostBlock(d HookDeps, log *slog.Logger, slot string) ([]string, error) {
	p := settingsPath(slot)
	local, err := d.Root.Entry(p)
	if err != nil {
		return nil, fmt.Errorf("pre-start hook: %w: %w", ErrHookStale, err)
	}
	old, err := os.ReadFile(local)
	if err != nil {
		// nspawn would start the node without kubeslot's settings (private users, its own network).
		return nil, fmt.Errorf("pre-start hook: %w: %s: %w", ErrHookStale, p, err)
	}
	i := bytes.Index(old, []byte(hostBlockMarker+"\n"))
	if i < 0 {
		log.Warn("pre-start hook: settings without a host-dependent part, left as they are", "file", p)
		return nil, nil
	}
	next := append(append([]byte{}, old[:i]...), hostSettings(func(q string, typ fs.FileMode) bool { return hostHasPath(d.Root, q, typ) })...)
	if bytes.Equal(next, old) {
		return nil, nil
	}
	if d.Record == nil {
		return nil, fmt.Errorf("pre-start hook: no ownership record: %s not rewritten", p)
	}
	if _, found := d.Record.Lookup(ownership.KindNspawnSettings, p); !found {
		return nil, fmt.Errorf("pre-start hook: %s is not in the ownership journal: not rewritten", p)
	}
	if err := atomicfile.WriteFile(local, next, 0o644); err != nil {
		return nil, fmt.Errorf("pre-start hook: %w: %w", ErrHookStale, err)
	}
	return []string{p}, nil
}

// nodeIPFile is the kubelet drop-in in the node carrying --node-ip: the pinned address is in the kubelet's unit
// already, so it is empty then; else the host's address, waited for (bounded), or empty when the host has none.
func nodeIPFile(ctx context.Context, d HookDeps, log *slog.Logger, rec *HookRecord) (nodeconfig.File, error) {
	// 0600 like the kubelet unit it extends (nodeconfig.Render).
	f := nodeconfig.File{Path: nodeconfig.NodeIPDropIn, Mode: 0o600}
	body := func(comment, arg string) []byte {
		return fmt.Appendf(nil, "# Written by kubeslot's pre-start hook before every node start.\n# %s\n[Service]\nEnvironment=%s=%s\n", comment, nodeconfig.NodeIPEnv, arg)
	}
	if d.Settings.NodeIP != "" {
		rec.NodeIP, rec.Pinned = d.Settings.NodeIP, true
		f.Data = body("The node IP is pinned by the sandbox record: --node-ip is in the kubelet unit.", "")
		return f, nil
	}
	pick := d.NodeAddr
	if pick == nil {
		pick = HostNodeAddr
	}
	wait := d.AddrWait
	if wait <= 0 {
		wait = DefaultAddrWait
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		a, err := pick()
		if err == nil && a.IsValid() && !a.IsLoopback() && !a.IsUnspecified() {
			rec.NodeIP = a.String()
			f.Data = body("The host's address at this start (the interface with the default route).", "--node-ip="+a.String())
			return f, nil
		}
		select {
		case <-ctx.Done():
			log.Warn("pre-start hook: the host has no node address yet: the kubelet picks its own", "waited", wait, "last", err)
			f.Data = body(fmt.Sprintf("The host had no address within %s: the kubelet picks one.", wait), "")
			return f, nil
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Host resolver files, in order of preference when the host's /etc/resolv.conf only names loopback servers (a
// local stub such as systemd-resolved's 127.0.0.53, which pods in their own network namespaces cannot reach).
const (
	hostResolvConf     = "/etc/resolv.conf"
	resolvedUpstream   = "/run/systemd/resolve/resolv.conf"
	resolvConfMaxBytes = 64 << 10
)

// nodeResolvConf renders the node's /etc/resolv.conf from the host's, and names the file it came from.
func nodeResolvConf(root *hostroot.Root, log *slog.Logger) ([]byte, string) {
	read := func(p string) ([]byte, bool) {
		local, err := root.Resolve(p)
		if err != nil {
			return nil, false
		}
		b, err := hostroot.ReadRegular(local, resolvConfMaxBytes)
		return b, err == nil
	}
	head := "# Written by kubeslot's pre-start hook from the host's %s before every node start.\n"
	host, ok := read(hostResolvConf)
	if !ok {
		log.Warn("pre-start hook: the host has no readable resolv.conf: the node gets no name servers", "file", hostResolvConf)
		return []byte("# Written by kubeslot's pre-start hook: the host had no readable " + hostResolvConf + ".\n"), ""
	}
	if onlyLoopback(host) {
		if up, ok := read(resolvedUpstream); ok && hasNameserver(up) && !onlyLoopback(up) {
			return append(fmt.Appendf(nil, head, resolvedUpstream), up...), resolvedUpstream
		}
		log.Warn("pre-start hook: the host's name servers are all loopback addresses: pods cannot reach them", "file", hostResolvConf)
	}
	return append(fmt.Appendf(nil, head, hostResolvConf), host...), hostResolvConf
}

// nameservers lists the nameserver addresses of a resolv.conf.
func nameservers(b []byte) []netip.Addr {
	var out []netip.Addr
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "nameserver" {
			if a, err := netip.ParseAddr(strings.SplitN(f[1], "%", 2)[0]); err == nil {
				out = append(out, a)
			}
		}
	}
	return out
}

func hasNameserver(b []byte) bool { return len(nameservers(b)) > 0 }

// onlyLoopback: the file names name servers and every one is a loopback address.
func onlyLoopback(b []byte) bool {
	ns := nameservers(b)
	for _, a := range ns {
		if !a.IsLoopback() {
			return false
		}
	}
	return len(ns) > 0
}

// hookRecordFile is NodeHostFile in <base>/state.
var hookRecordFile = hostroot.StateFile[HookRecord]{Dir: hostroot.StateDir, Name: NodeHostFile, Max: 64 << 10, Perm: 0o600}

func saveHookRecord(root *hostroot.Root, rec HookRecord) error {
	p, err := hookRecordFile.Path(root)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(path.Dir(p), 0o700); err != nil {
		return err
	}
	return hookRecordFile.Save(root, &rec)
}

// LoadHookRecord reads the last pre-start hook's record; found is false without one.
func LoadHookRecord(root *hostroot.Root) (rec HookRecord, found bool, err error) {
	r, err := hookRecordFile.Load(root)
	if r == nil {
		return rec, false, err
	}
	return *r, true, nil
}

// preStartHook is the drop-in's ExecStartPre= line: the current release's `kubeslot node-hook pre-start`. A release
// without the binary must not keep the node from starting (the node then starts with the settings written last),
// hence the shell's check; the hook's own exit code decides otherwise (see the failure policy above).
func (b *Backend) preStartHook() string {
	bin := b.root.HostPath(hostroot.CurrentLink, "kubeslot")
	return fmt.Sprintf(`# Before every start: re-render what the node takes from the host (lib/isolation/nspawn/hooks.go).
ExecStartPre=/bin/sh -c 'if [ -x "$$0" ]; then exec "$$0" node-hook pre-start --host-root="$$1" "$$2"; fi; echo "kubeslot: $$0 is missing: the node starts with the settings written last" >&2' %s %s %%i
`, bin, b.root.Base())
}
