package nspawn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
	"github.com/kubeslot/kubeslot/lib/nodeidentity"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

// kvmDevice is bound into the node when the host has it (KubeVirt-style
// workloads); nothing else needs it.
const kvmDevice = "/dev/kvm"

// modulesDir is bound read-only so the node's tools (and kubelet checks)
// can see the host kernel's modules; it is left out when the host has none.
const modulesDir = "/lib/modules"

// Configure writes slot's node files into its rootfs (kubelet, containerd,
// CNI, credentials, machine-id), ensures the node identity directory, and
// writes the host side: the .nspawn settings and the unit drop-in,
// journalled before they are created. systemd is reloaded only when the
// drop-in changed. A running node keeps running: changes apply at its next
// start.
func (b *Backend) Configure(ctx context.Context, slot string) error {
	if err := b.checkSlot(slot); err != nil {
		return err
	}
	log := b.log.With("slot", slot)
	// Before anything is written: a device asked for and missing fails here.
	devs, err := b.devices()
	if err != nil {
		return fmt.Errorf("configure slot %s: %w", slot, err)
	}
	rootfs, err := b.slotDir(rootfsPath(slot))
	if err != nil {
		return err
	}
	if _, found, err := readStamp(rootfs); err != nil {
		return fmt.Errorf("configure slot %s: %w", slot, err)
	} else if !found {
		return fmt.Errorf("configure slot %s: %s is not a provisioned slot rootfs: provision it first", slot, rootfs)
	}
	creds, err := nodeidentity.SlotCredentials(b.root, b.cfg, time.Now())
	if err != nil {
		return fmt.Errorf("configure slot %s: %w", slot, err)
	}
	opts := b.node
	opts.NVIDIARuntime = devs.nvidiaRuntime(rootfs)
	if devs.nvidia && opts.NVIDIARuntime == "" {
		log.Warn("the node image has no NVIDIA container toolkit: containerd keeps runc, so pods get the GPU device nodes from the device plugin but not the driver's libraries",
			"runtime", nodeconfig.NVIDIARuntimeBinary)
	}
	if opts.Preload, err = b.ensurePreloads(ctx); err != nil {
		return fmt.Errorf("configure slot %s: %w", slot, err)
	}
	files, err := nodeconfig.Render(b.cfg, creds, opts)
	if err != nil {
		return fmt.Errorf("configure slot %s: %w", slot, err)
	}
	if _, err := nodeconfig.EnsureMachineID(rootfs); err != nil {
		return fmt.Errorf("configure slot %s: %w", slot, err)
	}
	changed, err := nodeconfig.WriteFiles(rootfs, files)
	if err != nil {
		return fmt.Errorf("configure slot %s: %w", slot, err)
	}
	if err := b.ensureIdentity(); err != nil {
		return fmt.Errorf("configure slot %s: %w", slot, err)
	}
	if err := b.ensureNodeState(); err != nil {
		return fmt.Errorf("configure slot %s: %w", slot, err)
	}
	if b.bridgeNetwork() {
		// The bridge and its firewall chains appear in the host's network
		// namespace when the node first starts a pod: journal them now.
		if err := b.journalName(ownership.KindPodNetwork, nodeconfig.CNIBridgeName); err != nil {
			return fmt.Errorf("configure slot %s: %w", slot, err)
		}
	}
	hostChanged, dropInChanged, err := b.writeHostFiles(slot)
	if err != nil {
		return fmt.Errorf("configure slot %s: %w", slot, err)
	}
	if dropInChanged {
		if err := b.d.Systemd.Reload(ctx); err != nil {
			return fmt.Errorf("configure slot %s: %w", slot, err)
		}
	}
	changed = append(changed, hostChanged...)
	log.Info("slot configured", "changed", changed, "cgroups", b.node.CgroupProfile().Note(),
		"devices", devs.nodes, "driver_files", len(devs.readOnly))
	if len(changed) > 0 {
		if _, err := b.d.Systemd.Machine(ctx, slot); err == nil {
			log.Warn("the node of this slot is running: the changes apply when it next starts", "changed", changed)
		}
	}
	return nil
}

// ensureIdentity creates the node identity directory (0700: it will hold
// the kubelet's client key). Inside kubeslot's base it is kubeslot's own;
// elsewhere it is journalled like any host change.
func (b *Backend) ensureIdentity() error {
	if strings.HasPrefix(b.identity, b.root.Base()+"/") {
		local, err := b.local(b.identity)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(local, 0o700); err != nil {
			return fmt.Errorf("node identity directory: %w", err)
		}
		return nil
	}
	return b.ensureDir(b.identity, 0o700)
}

// bridgeNetwork reports whether the node runs [node.cni] mode "bridge" (not
// the rig's loopback network).
func (b *Backend) bridgeNetwork() bool {
	return !b.node.LoopbackCNI && b.cfg.Node.CNI.CNIMode() == config.CNIBridge
}

// nodeState is the node's state kept on the host across slots: host path
// under the base → path in the node, with the directory's mode. Only what
// the configuration uses is bound.
type nodeStateDir struct {
	host, node string
	mode       fs.FileMode
}

func (b *Backend) nodeState() []nodeStateDir {
	dirs := []nodeStateDir{{b.root.HostPath(hostroot.NodeDir, "containerd"), nodeconfig.ContainerdRoot, 0o711}}
	netd := nodeStateDir{b.root.HostPath(hostroot.NodeDir, "cni", "net.d"), nodeconfig.CNIConfDir, 0o755}
	switch {
	case b.node.LoopbackCNI:
	case b.cfg.Node.CNI.CNIMode() == config.CNICluster:
		dirs = append(dirs, netd,
			nodeStateDir{b.root.HostPath(hostroot.NodeDir, "cni", "bin"), nodeconfig.ClusterCNIBinDir, 0o755})
	case b.bridgeNetwork():
		// containerd renders the bridge network's config from its template
		// only once the kubelet passes the Node's podCIDR on; kept on the
		// host, the config of the last node is there when a new slot's
		// containerd starts, so its network is ready at once and the Node
		// turns Ready at the kubelet's first status (not one status period,
		// 10 s, later). A new podCIDR is rendered over it.
		dirs = append(dirs, netd)
	}
	return dirs
}

// ensureNodeState creates the node state directories (kubeslot's own tree:
// reset removes them with the base).
func (b *Backend) ensureNodeState() error {
	for _, d := range b.nodeState() {
		local, err := b.local(d.host)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(local, d.mode); err != nil {
			return fmt.Errorf("node state directory: %w", err)
		}
	}
	return nil
}

// hostFile is one file of the host side of a slot.
type hostFile struct {
	kind ownership.Kind
	path string
	data []byte
}

// hostFiles renders the .nspawn settings and the unit drop-in of slot, with
// the lines of [node.devices] (devices.go): in the settings before the
// host-dependent block, which the pre-start hook replaces (hooks.go); at
// the end of the drop-in.
func (b *Backend) hostFiles(slot string) ([]hostFile, error) {
	kvm := b.hostHas(kvmDevice, fs.ModeCharDevice)
	devs, err := b.devices()
	if err != nil {
		return nil, err
	}
	settings := b.nspawnSettings(slot)
	at := bytes.Index(settings, []byte(hostBlockMarker))
	if at < 0 {
		at = len(settings)
	}
	settings = slices.Insert(settings, at, devs.settings()...)
	return []hostFile{
		{ownership.KindNspawnSettings, settingsPath(slot), settings},
		{ownership.KindUnit, dropInPath(slot), append(b.dropIn(slot, kvm), devs.dropIn()...)},
	}, nil
}

// hostHas reports whether the host has p of the given type (ModeDir,
// ModeCharDevice).
func (b *Backend) hostHas(p string, typ fs.FileMode) bool { return hostHasPath(b.root, p, typ) }

// nspawnSettings is /etc/systemd/nspawn/<slot>.nspawn, which the unit's
// --settings=override lets win over the unit's command line (-U,
// --network-veth):
//
//   - PrivateUsers=no: -U needs the tree chowned or idmapped mounts, which
//     nested hosts refuse; the node runs as the host's root anyway.
//   - Capability=all: containerd and runc need the host's bounding set.
//   - VirtualEthernet=no, Private=no: the node uses the host's network
//     namespace; the kubelet's addresses are the host's.
//   - SystemCallFilter=@keyring bpf: runc joins a session keyring for each
//     container and loads eBPF device filters on cgroup v2; nspawn's
//     default filter denies both.
//   - the node identity directory bound over the kubelet's cert dir, so a
//     repave onto the other slot keeps the Node's client and serving
//     certificates; the node state directories (containerd's images, a
//     cluster CNI's files) bound likewise, so a repave pulls nothing again.
//   - no Volatile=: the rootfs is a plain writable directory.
//   - ResolvConf=off: the pre-start hook writes the node's resolv.conf
//     (hooks.go), with servers pods can reach.
//   - last, the host-dependent binds (hostSettings), which the pre-start
//     hook re-renders before every start.
func (b *Backend) nspawnSettings(slot string) []byte {
	var f strings.Builder
	fmt.Fprintf(&f, `# Written by kubeslot for slot %s; it is rewritten on every configure.
[Exec]
Boot=yes
PrivateUsers=no
Capability=all
SystemCallFilter=@keyring bpf
ResolvConf=off

[Network]
VirtualEthernet=no
Private=no

[Files]
`, slot)
	fmt.Fprintf(&f, "Bind=%s:%s\n", b.identity, nodeconfig.CertDir)
	if len(b.cfg.Node.PreloadImages) > 0 {
		fmt.Fprintf(&f, "BindReadOnly=%s:%s\n", b.root.HostPath(hostroot.CacheDir), nodeconfig.CacheMount)
	}
	for _, d := range b.nodeState() {
		fmt.Fprintf(&f, "Bind=%s:%s\n", d.host, d.node)
	}
	f.WriteString(hostSettings(b.hostHas))
	return []byte(f.String())
}

// dropIn is the kubeslot drop-in of systemd-nspawn@<slot>.service.
func (b *Backend) dropIn(slot string, kvm bool) []byte {
	var f strings.Builder
	fmt.Fprintf(&f, "# Written by kubeslot for slot %s; it is rewritten on every configure.\n[Service]\n", slot)
	if b.d.Settings.ReadOnlyNetSysctl {
		f.WriteString("# /proc/sys/net stays read-only (hostapi.Settings.ReadOnlyNetSysctl)\n")
	} else {
		f.WriteString(`# /proc/sys/net writable: CNI plugins and kube-proxy set network sysctls.
# The node shares the host's network namespace, so these are the host's.
Environment=SYSTEMD_NSPAWN_API_VFS_WRITABLE=network
`)
	}
	// Whole seconds: systemd's time span syntax differs from Go's.
	stop := int64(math.Ceil(b.cfg.Timeouts.Stop.Seconds()))
	fmt.Fprintf(&f, "# timeouts.stop\nTimeoutStopSec=%d\n", stop)
	f.WriteString(b.preStartHook())
	if kvm {
		fmt.Fprintf(&f, "DeviceAllow=%s rw\n", kvmDevice)
	}
	if b.node.CgroupV1Writable {
		// A v1 device cgroup cannot allow its children more than it has:
		// runc creates device nodes (mknod) and allows the console.
		f.WriteString(`# sandbox: writable cgroup v1 controllers (hostapi.Settings.CgroupV1Writable)
DeviceAllow=char-* m
DeviceAllow=block-* m
DeviceAllow=char-/dev/console rwm
`)
	}
	return []byte(f.String())
}

// writeHostFiles writes the host side of slot where it differs, journalling
// each file and missing directory first. It returns the paths it changed and
// whether the drop-in was one of them (systemd must then reload).
func (b *Backend) writeHostFiles(slot string) (changed []string, dropIn bool, err error) {
	// The drop-in directory is the unit's own: files are written into it,
	// so a link in its place is refused like one in a unit file's.
	if _, err := b.root.Entry(dropInDir(slot)); err != nil {
		return changed, dropIn, err
	}
	for _, d := range []string{hostroot.NspawnDir, dropInDir(slot)} {
		if err := b.ensureDir(d, 0o755); err != nil {
			return changed, dropIn, err
		}
	}
	files, err := b.hostFiles(slot)
	if err != nil {
		return changed, dropIn, err
	}
	for _, f := range files {
		ok, err := b.writeHostFile(f)
		if err != nil {
			return changed, dropIn, err
		}
		if ok {
			changed = append(changed, f.path)
			dropIn = dropIn || f.kind == ownership.KindUnit
		}
	}
	return changed, dropIn, nil
}

// A link in the file's place is refused (hostroot.ErrLink), not replaced.
func (b *Backend) writeHostFile(f hostFile) (bool, error) {
	local, err := b.root.Entry(f.path)
	if err != nil {
		return false, err
	}
	if fi, err := os.Lstat(local); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm() == 0o644 {
		if old, err := os.ReadFile(local); err == nil && bytes.Equal(old, f.data) {
			return false, nil
		}
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	if err := b.journal(f.kind, f.path); err != nil {
		return false, err
	}
	if err := atomicfile.WriteFile(local, f.data, 0o644); err != nil {
		return false, err
	}
	return true, nil
}

// timeoutCause builds a deadline cause naming the wait and its setting.
func timeoutCause(what string, d time.Duration, setting string) error {
	return fmt.Errorf("%s not done within %s (%s): %w", what, d, setting, context.DeadlineExceeded)
}
