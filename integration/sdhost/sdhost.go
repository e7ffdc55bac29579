// Package sdhost boots throwaway, isolated systemd "hosts" for kubeslot's whole-system tests: a real systemd as PID 1
// in new pid, mount, uts, ipc, cgroup (and by default net) namespaces, whose root is an overlay of the machine's own
// "/" (read-only, below) and a tmpfs "disk" (above). The machine's enabled units are whited out, so only systemd's
// basics and what a test installs run inside. Tests drive a host over its D-Bus system bus, through /proc/PID/root,
// or with nsenter. Only test code (integration/...) may import this package; it needs root.
//
// How a host is made: Go creates the host's cgroup dirs (<hierarchy>/kubeslot-rig/NAME), a small shell wrapper
// moves itself into them and execs `unshare --pid --mount ... --cgroup --kill-child scripts/rig/host-init.sh`, so
// the new cgroup namespace is rooted there. host-init.sh mounts the overlay and API filesystems, pivots and execs
// systemd. All of that lives in the private mount namespace and vanishes with the host; Stop then removes the cgroup
// dirs and the state dir. Hosts are started from a dedicated OS thread with a parent-death signal, and unshare kills
// PID 1 when it dies: a test binary that crashes takes its hosts down with it (Start reclaims what they left).
//
// The persistent disk: overlayfs refuses an upper/work dir on the lower's filesystem (ELOOP), so the disk must be
// another filesystem. A Persistent host gets a tmpfs mounted on the machine at <StateDir>/<Name>/disk: it outlives the
// host's namespaces, so Kill (SIGKILL to PID 1, a power cut) and Boot find the upper layer as it was, like a disk.
// A tmpfs rather than a loop-mounted ext4 image: no image file, no mkfs fork, no loop device to leak, and writes
// need no sync to survive a SIGKILL of the namespace. Stop unmounts it (leakcheck verifies). overlayfs resets its
// own work/work subdir at each mount, so the work dir needs no cleanup between boots. A non-persistent host mounts
// its tmpfs inside its own mount namespace, so every Boot starts from a fresh disk.
//
// V1Controllers (hybrid machines only): on a machine whose controllers are all bound to cgroup v1, cgroup2 has no
// controllers, so neither the host nor anything inside it can limit or even account a container, and runc refuses to
// start one. Such a host also gets a dir of its own in each v1 controller hierarchy it needs (below the cgroup of the
// test process: the machine's limits on the test still bind), joined by the wrapper shell with the others before
// unshare, and mounted by host-init.sh next to name=systemd and cgroup2, read-write: the host's systemd runs in full
// hybrid mode and hands the controllers on to nspawn, containerd and runc. Stop removes those dirs bottom-up like the
// others; Start also reclaims dirs of the same name that a crashed run left below another cgroup.
//
// Journals: a Persistent host keeps its journal on the disk (Storage=persistent, /var/log/journal), so logs of the
// boot before a Kill stay readable; other hosts use Storage=volatile (/run/log/journal). Journal reads both.
package sdhost

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"time"

	"github.com/kubeslot/kubeslot/integration/leakcheck"
	"github.com/kubeslot/kubeslot/lib/mountinfo"
)

// Bind is a bind mount from the machine into a host.
type Bind struct {
	Source   string // path on the machine; must exist
	Target   string // absolute path inside the host; created (dir or empty file) when missing
	ReadOnly bool
}

// Options describe a host. Only Name is required.
type Options struct {
	// Name is unique among running hosts; it names the cgroup dir, the state dir and the hostname.
	// Lower-case letters, digits and '-', at most 40 characters.
	Name string
	// SharedNetwork shares the machine's network namespace (tests then use loopback only); false gives the host a
	// private network namespace holding just lo.
	SharedNetwork bool
	// NodeNetwork gives the host's own network namespace (not SharedNetwork), at every boot, a link carrying NodeIP
	// and a default route, so a node in it can use NodeIP as its kubelet's --node-ip (see netns.go). The machine's
	// namespace is never touched; connections to and from the machine go through integration/netfwd.
	NodeNetwork bool
	// NodeIP is the node address of a NodeNetwork host (a /24 is assigned); zero: the first free 10.213.<n>.2 of
	// this test process.
	NodeIP netip.Addr
	// Persistent keeps the upper (writable) layer across Kill/PowerOff and Boot, like a disk.
	Persistent bool
	Binds      []Bind
	// CgroupMode is "unified" (default: the host sees only its own cgroup2 subtree) or "hybrid" (name=systemd v1 plus
	// cgroup2, as the machine has; needs a hybrid machine).
	CgroupMode string
	// V1Controllers (needs CgroupMode "hybrid", and a hybrid machine whose v1 controllers each have a hierarchy of
	// their own; see V1ControllersAvailable) gives the host writable subtrees of the machine's v1 hierarchies of
	// blkio, cpu, cpuacct, cpuset, devices, freezer, memory and pids, mounted at /sys/fs/cgroup/<controller> next to
	// name=systemd and cgroup2: its systemd then runs in full hybrid mode, and runc can make containers inside it
	// (cgroup2 there has no controllers: they are all bound to v1). It also keeps CAP_MKNOD in the host's bounding
	// set and gives it a real /dev/net/tun, which container runtimes and systemd-nspawn's device policy expect.
	V1Controllers bool
	// StateDir holds the hosts' state dirs; default os.TempDir()/kubeslot-rig.
	StateDir string
	// DiskSize is the size= of the disk tmpfs; default "4g" (tmpfs only uses what is written).
	DiskSize string
	// BootTimeout bounds each boot, on top of the context; default 90s.
	BootTimeout time.Duration
	Log         *slog.Logger
}

// Host is one isolated systemd host. Its methods are safe for concurrent use.
type Host struct {
	opts    Options
	log     *slog.Logger
	scripts string
	state   string   // <StateDir>/<Name>
	cgroups []string // the host's cgroup dirs on the machine, one per mounted hierarchy (v1's included)
	v1      []v1Dir  // the v1 controller dirs (Options.V1Controllers), also in cgroups
	layout  string   // "hybrid" or "unified": what host-init mounts

	mu       sync.Mutex
	inst     *instance // the current boot; nil before the first boot
	diskUp   bool      // the persistent disk tmpfs is mounted on the machine
	stopped  bool
	unlock   func() // releases the leakcheck share taken by Start
	bootSeen int
	nodeIP   netip.Addr // NodeNetwork: claimed by prepare, released by Stop
	// onNetwork is OnNetwork's callback.
	onNetwork func(netns string)
}

const (
	rigDir       = "kubeslot-rig" // cgroup parent dir and default state dir name
	containerEnv = "kubeslot-rig" // value of container=; systemd reports Virtualization=container-other
	systemdPath  = "/lib/systemd/systemd"
	stopBound    = 20 * time.Second // clean poweroff bound when the context has none sooner
	killBound    = 15 * time.Second // wait for the namespace to go after SIGKILL
)

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$`)

// Start prepares and boots a host, waiting (bounded) until `systemctl is-system-running` is running or degraded.
// On failure nothing is left behind and the error carries the tail of the host's console log.
func Start(ctx context.Context, o Options) (*Host, error) {
	h, err := newHost(o)
	if err != nil {
		return nil, err
	}
	if h.unlock, err = leakcheck.Share(ctx); err != nil {
		return nil, fmt.Errorf("host %s: %w", o.Name, err)
	}
	if err := h.prepare(); err != nil {
		return nil, errors.Join(err, h.Stop(context.Background()))
	}
	if err := h.Boot(ctx); err != nil {
		return nil, errors.Join(err, h.Stop(context.Background()))
	}
	return h, nil
}

func newHost(o Options) (*Host, error) {
	if !nameRE.MatchString(o.Name) {
		return nil, fmt.Errorf("sdhost: Options.Name %q: want 1-40 of [a-z0-9-], starting and ending alphanumeric", o.Name)
	}
	if o.CgroupMode == "" {
		o.CgroupMode = "unified"
	}
	if o.StateDir == "" {
		o.StateDir = filepath.Join(os.TempDir(), rigDir)
	}
	if !filepath.IsAbs(o.StateDir) {
		return nil, fmt.Errorf("sdhost: host %s: Options.StateDir %q is not absolute", o.Name, o.StateDir)
	}
	if o.DiskSize == "" {
		o.DiskSize = "4g"
	}
	if o.BootTimeout <= 0 {
		o.BootTimeout = 90 * time.Second
	}
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for i, b := range o.Binds {
		if !filepath.IsAbs(b.Source) || !filepath.IsAbs(b.Target) || filepath.Clean(b.Target) != b.Target || b.Target == "/" {
			return nil, fmt.Errorf("sdhost: host %s: Binds[%d] %q -> %q: want absolute paths and a clean target other than /", o.Name, i, b.Source, b.Target)
		}
		if _, err := os.Stat(b.Source); err != nil {
			return nil, fmt.Errorf("sdhost: host %s: Binds[%d]: %w", o.Name, i, err)
		}
	}
	if err := checkNodeNetwork(o); err != nil {
		return nil, err
	}
	scripts, err := ScriptsDir()
	if err != nil {
		return nil, err
	}
	if o.V1Controllers && o.CgroupMode != "hybrid" {
		return nil, fmt.Errorf("sdhost: host %s: Options.V1Controllers needs CgroupMode \"hybrid\" (the v1 controllers are mounted next to name=systemd and cgroup2; a %s host's systemd would ignore them), got %q",
			o.Name, o.CgroupMode, o.CgroupMode)
	}
	cgroups, layout, err := cgroupDirs(o.CgroupMode, o.Name)
	if err != nil {
		return nil, fmt.Errorf("sdhost: host %s: %w", o.Name, err)
	}
	var v1 []v1Dir
	if o.V1Controllers {
		if v1, err = v1Dirs(o.Name); err != nil {
			return nil, fmt.Errorf("sdhost: host %s: %w", o.Name, err)
		}
		for _, d := range v1 {
			cgroups = append(cgroups, d.dir)
		}
	}
	return &Host{
		opts: o, log: log.With("host", o.Name), scripts: scripts,
		state: filepath.Join(o.StateDir, o.Name), cgroups: cgroups, v1: v1, layout: layout,
	}, nil
}

// prepare reclaims what a crashed earlier run of the same name left, then lays out the state dir and cgroup dirs.
func (h *Host) prepare() error {
	if err := h.reclaimStale(); err != nil {
		return err
	}
	if err := h.claimNodeIP(); err != nil {
		return err
	}
	for _, d := range []string{"root", "rw", "disk"} {
		if err := mkdirAllRetry(filepath.Join(h.state, d)); err != nil {
			return fmt.Errorf("host %s: state dir: %w", h.opts.Name, err)
		}
	}
	if err := h.writeSkeleton(); err != nil {
		return fmt.Errorf("host %s: skeleton: %w", h.opts.Name, err)
	}
	for _, d := range h.cgroups {
		if err := mkdirAllRetry(d); err != nil {
			return fmt.Errorf("host %s: cgroup dir: %w", h.opts.Name, err)
		}
	}
	if err := prepareV1(h.v1); err != nil {
		return fmt.Errorf("host %s: %w", h.opts.Name, err)
	}
	if h.opts.Persistent {
		if err := h.mountDisk(); err != nil {
			return err
		}
	}
	return nil
}

// reclaimStale removes the state and cgroup dirs of a host of the same name that is no longer running (its test
// binary died). A host whose cgroup still holds processes is running: that is an error, not something to remove.
func (h *Host) reclaimStale() error {
	for _, d := range h.cgroups {
		if pids := cgroupPIDs(d); len(pids) > 0 {
			return fmt.Errorf("sdhost: host %s is already running (cgroup %s holds pids %v)", h.opts.Name, d, pids)
		}
	}
	// Also without V1Controllers: an earlier run of the same name may have had them.
	for _, d := range strayV1Dirs(h.opts.Name, h.v1) {
		if pids := cgroupPIDs(d); len(pids) > 0 {
			return fmt.Errorf("sdhost: host %s is already running elsewhere (cgroup %s holds pids %v)", h.opts.Name, d, pids)
		}
		h.log.Warn("reclaiming a cgroup of an earlier host of the same name", "cgroup", d)
		if err := removeCgroupTree(d, true); err != nil {
			return err
		}
		removeIfEmpty(filepath.Dir(d))
	}
	_, err := os.Stat(h.state)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	h.log.Warn("reclaiming state of an earlier host of the same name", "state", h.state)
	return h.cleanup()
}

// Boot boots the host again after PowerOff or Kill (Start does the first boot). A Persistent host keeps its disk;
// any other host starts from a fresh one.
func (h *Host) Boot(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return fmt.Errorf("sdhost: host %s: Boot after Stop", h.opts.Name)
	}
	if h.inst != nil && !h.inst.exited() {
		return fmt.Errorf("sdhost: host %s: Boot while running (pid %d)", h.opts.Name, h.inst.pid)
	}
	if h.opts.Persistent && !h.diskUp {
		if err := h.mountDisk(); err != nil {
			return err
		}
	}
	// A real machine boots with fresh cgroups: drop the empty dirs the last boot's systemd left below ours.
	for _, d := range h.cgroups {
		if err := removeCgroupTree(d, false); err != nil {
			return fmt.Errorf("host %s: reset cgroups: %w", h.opts.Name, err)
		}
	}
	h.bootSeen++
	inst, err := h.spawn(ctx)
	if err != nil {
		return err
	}
	h.inst = inst
	if err := h.setupNodeNetwork(inst); err != nil {
		inst.kill(killBound)
		return err
	}
	if h.onNetwork != nil && !h.opts.SharedNetwork {
		h.onNetwork(fmt.Sprintf("/proc/%d/ns/net", inst.pid))
	}
	if err := h.waitRunning(ctx, inst); err != nil {
		inst.kill(killBound)
		return err
	}
	return nil
}

// PID is the host's PID 1 as seen from the machine (0 before the first boot).
func (h *Host) PID() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.inst == nil {
		return 0
	}
	return h.inst.pid
}

// Root is "/proc/<pid>/root": the host's filesystem seen from the machine. Absolute symlinks inside the host resolve
// against the machine's root when followed through this path; WriteFile and ReadFile do not have that problem.
func (h *Host) Root() string { return fmt.Sprintf("/proc/%d/root", h.PID()) }

// Running reports whether the host's PID 1 is alive.
func (h *Host) Running() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.inst != nil && !h.inst.exited()
}

// PowerOff shuts the host down cleanly (SIGRTMIN+4 to PID 1, systemd's poweroff, no D-Bus needed) and waits until
// its namespaces are gone. After the context's deadline or 20 s, whichever is sooner, it sends SIGKILL and returns
// an error saying so.
func (h *Host) PowerOff(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.powerOff(ctx)
}

func (h *Host) powerOff(ctx context.Context) error {
	inst := h.inst
	if inst == nil || inst.exited() {
		return nil
	}
	t0 := time.Now()
	bound := stopBound
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < bound {
		bound = max(time.Until(dl), 0)
	}
	// SIGRTMIN+4: glibc's SIGRTMIN is 34 (the kernel's 32 and 33 are reserved by it), and systemd counts from there.
	if err := inst.proc.Signal(syscall.Signal(34 + 4)); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("host %s: poweroff signal to pid %d: %w", h.opts.Name, inst.pid, err)
	}
	timer := time.NewTimer(bound)
	defer timer.Stop()
	select {
	case <-inst.done:
		h.log.Info("host powered off", "pid", inst.pid, "took", time.Since(t0).Round(time.Millisecond))
		return nil
	case <-timer.C:
	}
	if err := inst.kill(killBound); err != nil {
		return fmt.Errorf("host %s: no poweroff within %v, and SIGKILL failed: %w", h.opts.Name, bound, err)
	}
	return fmt.Errorf("host %s: no poweroff within %v; killed it (console: %s)", h.opts.Name, bound, h.consoleTail())
}

// Kill is a power cut: SIGKILL to PID 1, which ends the whole pid namespace at once. It returns once the host's
// namespaces are gone.
func (h *Host) Kill() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.inst == nil || h.inst.exited() {
		return nil
	}
	t0 := time.Now()
	if err := h.inst.kill(killBound); err != nil {
		return fmt.Errorf("host %s: %w", h.opts.Name, err)
	}
	h.log.Info("host killed", "pid", h.inst.pid, "took", time.Since(t0).Round(time.Millisecond))
	return nil
}

// Stop powers the host off if it runs and removes everything it had on the machine: cgroup dirs, the disk mount,
// the state dir. It is idempotent. A forced kill during poweroff is logged, not returned: only cleanup failures are.
func (h *Host) Stop(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return nil
	}
	if err := h.powerOff(ctx); err != nil {
		h.log.Warn("stop", "err", err)
	}
	if h.inst != nil {
		h.inst.release()
	}
	err := h.cleanup()
	if err == nil {
		h.stopped = true
		h.releaseNodeIP()
		if h.unlock != nil {
			h.unlock()
		}
	}
	return err
}

// cleanup removes cgroup dirs, the persistent disk mount and the state dir; the host must not be running.
func (h *Host) cleanup() error {
	var errs []error
	for _, d := range h.cgroups {
		if err := removeCgroupTree(d, true); err != nil {
			errs = append(errs, err)
		}
		removeIfEmpty(filepath.Dir(d)) // the shared kubeslot-rig parent, once the last host is gone
	}
	disk := filepath.Join(h.state, "disk")
	if mounted, err := isMountPoint(disk); err != nil {
		errs = append(errs, err)
	} else if mounted {
		if err := unmount(disk); err != nil {
			errs = append(errs, fmt.Errorf("host %s: %w", h.opts.Name, err))
		}
	}
	h.diskUp = false
	// Never RemoveAll through a mount: that would delete the mounted tree's files.
	if under, err := mountinfo.Under(h.state); err != nil {
		errs = append(errs, err)
	} else if len(under) > 0 {
		errs = append(errs, fmt.Errorf("host %s: mounts still under %s on the machine: %v", h.opts.Name, h.state, under))
	} else if err := os.RemoveAll(h.state); err != nil {
		errs = append(errs, fmt.Errorf("host %s: remove state dir: %w", h.opts.Name, err))
	}
	if len(errs) == 0 {
		removeIfEmpty(h.opts.StateDir)
	}
	return errors.Join(errs...)
}

// mountDisk mounts the persistent disk tmpfs on the machine. Its upper/ dir is created by the first boot.
func (h *Host) mountDisk() error {
	disk := filepath.Join(h.state, "disk")
	if err := mkdirAllRetry(disk); err != nil {
		return fmt.Errorf("host %s: %w", h.opts.Name, err)
	}
	if err := syscall.Mount("rig-disk-"+h.opts.Name, disk, "tmpfs", 0, "mode=0755,size="+h.opts.DiskSize); err != nil {
		return fmt.Errorf("host %s: mount disk tmpfs at %s (size=%s): %w", h.opts.Name, disk, h.opts.DiskSize, err)
	}
	h.diskUp = true
	return nil
}

// consoleTail is the end of the host's console log (host-init's output and systemd's console messages).
func (h *Host) consoleTail() string {
	data, err := os.ReadFile(filepath.Join(h.state, "console.log"))
	if err != nil {
		return fmt.Sprintf("(no console log: %v)", err)
	}
	const max = 3000
	if len(data) > max {
		data = data[len(data)-max:]
	}
	return "\n--- console tail ---\n" + string(data) + "\n---"
}

// Available reports whether hosts can run here: nil, or the reason to print when skipping.
func Available() error {
	var errs []error
	if os.Geteuid() != 0 {
		errs = append(errs, errors.New("needs root"))
	}
	for _, tool := range []string{"unshare", "nsenter", "setpriv", "mount", "umount", "pivot_root", "cp", "rm", "mkdir", "journalctl"} {
		if _, err := lookPath(tool); err != nil {
			errs = append(errs, fmt.Errorf("%s not found in PATH or /usr/sbin, /sbin", tool))
		}
	}
	for _, f := range []string{systemdPath, "/bin/bash", "/bin/sh", "/proc/self/ns/cgroup"} {
		if _, err := os.Stat(f); err != nil {
			errs = append(errs, err)
		}
	}
	if fss, err := os.ReadFile("/proc/filesystems"); err != nil || !regexp.MustCompile(`\boverlay\b`).Match(fss) {
		errs = append(errs, errors.New("no overlay filesystem in /proc/filesystems"))
	}
	if _, err := machineLayout(); err != nil {
		errs = append(errs, err)
	}
	if _, err := ScriptsDir(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ScriptsDir locates scripts/rig: $KUBESLOT_RIG_SCRIPTS, or scripts/rig of the module root found by walking up from
// the working directory to the directory holding go.mod.
func ScriptsDir() (string, error) {
	check := func(dir string) (string, error) {
		if _, err := os.Stat(filepath.Join(dir, "host-init.sh")); err != nil {
			return "", fmt.Errorf("sdhost: rig scripts: %w", err)
		}
		return dir, nil
	}
	if d := os.Getenv("KUBESLOT_RIG_SCRIPTS"); d != "" {
		abs, err := filepath.Abs(d)
		if err != nil {
			return "", fmt.Errorf("sdhost: KUBESLOT_RIG_SCRIPTS=%q: %w", d, err)
		}
		return check(abs)
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("sdhost: %w", err)
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return check(filepath.Join(dir, "scripts", "rig"))
		}
		if dir == filepath.Dir(dir) {
			return "", fmt.Errorf("sdhost: no go.mod above %s; set KUBESLOT_RIG_SCRIPTS", wd)
		}
	}
}
