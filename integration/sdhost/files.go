package sdhost

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kubeslot/kubeslot/lib/mountinfo"
	"golang.org/x/sys/unix"
)

// maskedUnits are masked in every host (an empty unit file counts as masked): network configuration (with a shared
// network it would be the machine's), clocks, gettys, maintenance timers, hardware and kernel-facility mounts.
var maskedUnits = []string{
	"systemd-timesyncd.service", "systemd-networkd.service", "systemd-networkd.socket",
	"systemd-networkd-wait-online.service", "systemd-network-generator.service", "systemd-resolved.service",
	"networking.service", "console-getty.service", "getty@tty1.service", "serial-getty@ttyS0.service",
	"container-getty@.service", "systemd-pstore.service", "e2scrub_reap.service", "systemd-firstboot.service",
	"systemd-machine-id-commit.service", "apt-daily.timer", "apt-daily-upgrade.timer", "dpkg-db-backup.timer",
	"e2scrub_all.timer", "fstrim.timer", "man-db.timer", "logrotate.timer", "dev-hugepages.mount",
	"sys-fs-fuse-connections.mount", "sys-kernel-config.mount", "sys-kernel-debug.mount", "sys-kernel-tracing.mount",
	"proc-sys-fs-binfmt_misc.automount", "systemd-binfmt.service",
}

// writeSkeleton writes, with no fork, the trees host-init.sh copies: skel/ (a fresh disk: upper/ and work/) and
// devskel/ (the host's /dev). Every dir is 0755: cp -a carries a tree root's mode onto the target, and a 0700 "/"
// kills dbus-daemon (user messagebus) and hangs the boot.
func (h *Host) writeSkeleton() error {
	skel := filepath.Join(h.state, "skel")
	upper := filepath.Join(skel, "upper")
	storage := "volatile"
	if h.opts.Persistent {
		storage = "persistent"
	}
	files := map[string]string{
		"etc/hostname": h.opts.Name + "\n",
		"etc/systemd/journald.conf.d/kubeslot-rig.conf": "[Journal]\nStorage=" + storage + "\nRateLimitBurst=0\n",
		"etc/systemd/system.conf.d/kubeslot-rig.conf":   "[Manager]\nDefaultTimeoutStopSec=15s\n",
	}
	for _, u := range maskedUnits {
		files["etc/systemd/system/"+u] = ""
	}
	for _, d := range []string{"", "upper", "work", "upper/.oldroot", "upper/etc/systemd/system-generators"} {
		if err := mkdir0755(filepath.Join(skel, d)); err != nil {
			return err
		}
	}
	for rel, content := range files {
		p := filepath.Join(upper, rel)
		if err := mkdir0755(filepath.Dir(p)); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	// The SysV generator would bring back /etc/init.d scripts (the machine's postgresql, ...).
	if err := os.Symlink("/dev/null", filepath.Join(upper, "etc/systemd/system-generators/systemd-sysv-generator")); err != nil {
		return err
	}

	dev := filepath.Join(h.state, "devskel")
	for _, d := range []string{"", "pts", "shm", "mqueue"} {
		if err := mkdir0755(filepath.Join(dev, d)); err != nil {
			return err
		}
	}
	// The nodes systemd-nspawn gives a container. They are never opened here; cp -a recreates them in the host's
	// /dev tmpfs (which is not nodev).
	for n, num := range map[string][2]uint32{"null": {1, 3}, "zero": {1, 5}, "full": {1, 7}, "random": {1, 8},
		"urandom": {1, 9}, "tty": {5, 0}} {
		p := filepath.Join(dev, n)
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(num[0], num[1]))); err != nil {
			return fmt.Errorf("mknod %s: %w", p, err)
		}
		if err := os.Chmod(p, 0o666); err != nil { // the umask narrowed it
			return err
		}
	}
	if h.opts.V1Controllers {
		// /dev/net/tun: systemd-nspawn@.service allows it to its container (DeviceAllow=/dev/net/tun rwm) and skips
		// the line when the node is missing; on v1 a child's device cgroup can never allow more than its parent's.
		if err := mkdir0755(filepath.Join(dev, "net")); err != nil {
			return err
		}
		p := filepath.Join(dev, "net", "tun")
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(10, 200))); err != nil {
			return fmt.Errorf("mknod %s: %w", p, err)
		}
		if err := os.Chmod(p, 0o666); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(dev, "console"), nil, 0o600); err != nil { // bind target for console.log
		return err
	}
	links := map[string]string{"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"}
	for n, target := range links {
		if err := os.Symlink(target, filepath.Join(dev, n)); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(h.state, "console.log"), nil, 0o644)
}

func mkdir0755(p string) error {
	if err := os.MkdirAll(p, 0o755); err != nil {
		return err
	}
	return os.Chmod(p, 0o755) // the umask may have narrowed it
}

// mkdirAllRetry is MkdirAll that survives another host's Stop removing a shared, then-empty parent meanwhile.
func mkdirAllRetry(p string) error {
	var err error
	for range 5 {
		if err = os.MkdirAll(p, 0o755); err == nil || !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return err
}

func removeIfEmpty(dir string) { _ = syscall.Rmdir(dir) }

// WriteFile writes data to path inside the host (creating parent dirs, 0755), atomically: a temp file in the same
// dir, renamed over path, so a .path unit never sees a half-written file. Every component, symlinks included, is
// resolved inside the host's root (openat2 RESOLVE_IN_ROOT): an absolute symlink in the host cannot redirect the
// write onto the machine, as it would through a plain /proc/PID/root/... path.
func (h *Host) WriteFile(p string, data []byte, mode os.FileMode) error {
	if !h.Running() {
		return fmt.Errorf("host %s: WriteFile %s: not running", h.opts.Name, p)
	}
	if err := writeInRoot(h.Root(), p, data, mode); err != nil {
		return fmt.Errorf("host %s: %w", h.opts.Name, err)
	}
	return nil
}

// ReadFile reads path inside the host, resolving it inside the host's root like WriteFile.
func (h *Host) ReadFile(p string) ([]byte, error) {
	if !h.Running() {
		return nil, fmt.Errorf("host %s: ReadFile %s: not running", h.opts.Name, p)
	}
	data, err := readInRoot(h.Root(), p)
	if err != nil {
		return nil, fmt.Errorf("host %s: %w", h.opts.Name, err)
	}
	return data, nil
}

func openInRoot(rootfd int, rel string, flags uint64) (int, error) {
	return unix.Openat2(rootfd, rel, &unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
}

func readInRoot(root, p string) ([]byte, error) {
	rootfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("read %s: open root %s: %w", p, root, err)
	}
	defer unix.Close(rootfd)
	fd, err := openInRoot(rootfd, relPath(p), unix.O_RDONLY)
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: p, Err: err}
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	return io.ReadAll(f)
}

func relPath(p string) string {
	return strings.TrimPrefix(filepath.Clean("/"+p), "/")
}

func writeInRoot(root, p string, data []byte, mode os.FileMode) error {
	rel := relPath(p)
	if rel == "" {
		return fmt.Errorf("write %s: not a file path", p)
	}
	rootfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("write %s: open root %s: %w", p, root, err)
	}
	defer unix.Close(rootfd)
	dirfd, err := mkdirAllInRoot(rootfd, filepath.Dir(rel))
	if err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	defer unix.Close(dirfd)
	base := filepath.Base(rel)
	tmp := fmt.Sprintf(".%s.rig-%d-%d", base, os.Getpid(), time.Now().UnixNano())
	fd, err := unix.Openat(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("write %s: create temp file: %w", p, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, err = f.Write(data)
	if err == nil {
		err = unix.Fchmod(fd, uint32(mode.Perm()))
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(dirfd, tmp, dirfd, base)
	}
	if err != nil {
		_ = unix.Unlinkat(dirfd, tmp, 0)
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}

// mkdirAllInRoot opens dir (relative, inside rootfd) as an O_PATH fd, creating missing components with mode 0755.
func mkdirAllInRoot(rootfd int, dir string) (int, error) {
	if dir == "." || dir == "" {
		return unix.Dup(rootfd)
	}
	parts := strings.Split(dir, "/")
	for i := range parts {
		sub := strings.Join(parts[:i+1], "/")
		fd, err := openInRoot(rootfd, sub, unix.O_PATH|unix.O_DIRECTORY)
		if err == nil {
			if i == len(parts)-1 {
				return fd, nil
			}
			unix.Close(fd)
			continue
		}
		if !errors.Is(err, unix.ENOENT) {
			return -1, fmt.Errorf("open %s: %w", sub, err)
		}
		parent, err := mkdirAllInRoot(rootfd, filepath.Dir(sub))
		if err != nil {
			return -1, err
		}
		err = unix.Mkdirat(parent, parts[i], 0o755)
		unix.Close(parent)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, fmt.Errorf("mkdir %s: %w", sub, err)
		}
		if fd, err = openInRoot(rootfd, sub, unix.O_PATH|unix.O_DIRECTORY); err != nil {
			return -1, fmt.Errorf("open %s: %w", sub, err)
		}
		if i == len(parts)-1 {
			return fd, nil
		}
		unix.Close(fd)
	}
	return -1, fmt.Errorf("mkdir %s: unreachable", dir)
}

// statfs f_type of the two cgroup filesystems.
const cgroup2Magic, cgroup1Magic = 0x63677270, 0x27e0eb

// machineLayout is the machine's cgroup layout: "hybrid" (v1 name=systemd + cgroup2 at unified/) or "unified".
func machineLayout() (string, error) {
	fsType := func(p string) int64 {
		var st syscall.Statfs_t
		if syscall.Statfs(p, &st) != nil {
			return 0
		}
		return int64(st.Type)
	}
	switch {
	case fsType("/sys/fs/cgroup") == cgroup2Magic:
		return "unified", nil
	case fsType("/sys/fs/cgroup/unified") == cgroup2Magic && fsType("/sys/fs/cgroup/systemd") == cgroup1Magic:
		return "hybrid", nil
	}
	return "", errors.New("cgroup layout not supported: want cgroup2 at /sys/fs/cgroup, or name=systemd v1 plus cgroup2 at /sys/fs/cgroup/unified")
}

// cgroupDirs are the machine-side cgroup dirs of a host, and the layout host-init gives its systemd.
func cgroupDirs(mode, name string) ([]string, string, error) {
	machine, err := machineLayout()
	if err != nil {
		return nil, "", err
	}
	switch {
	case mode == "unified" && machine == "unified":
		return []string{filepath.Join("/sys/fs/cgroup", rigDir, name)}, "unified", nil
	case mode == "unified" && machine == "hybrid":
		return []string{filepath.Join("/sys/fs/cgroup/unified", rigDir, name)}, "unified", nil
	case mode == "hybrid" && machine == "hybrid":
		return []string{filepath.Join("/sys/fs/cgroup/systemd", rigDir, name),
			filepath.Join("/sys/fs/cgroup/unified", rigDir, name)}, "hybrid", nil
	case mode == "hybrid":
		return nil, "", fmt.Errorf("Options.CgroupMode %q needs a hybrid machine; this one is %s", mode, machine)
	}
	return nil, "", fmt.Errorf("Options.CgroupMode %q: want unified or hybrid", mode)
}

// cgroupPIDs lists the processes in a cgroup subtree.
func cgroupPIDs(dir string) []int {
	var pids []int
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		data, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		for _, f := range strings.Fields(string(data)) {
			if n, err := strconv.Atoi(f); err == nil {
				pids = append(pids, n)
			}
		}
		return nil
	})
	return pids
}

// removeCgroupTree removes the cgroup dirs below dir, bottom-up, and dir itself when self is set. A cgroup whose
// last process just exited can stay busy for a moment, so EBUSY is retried for a bounded time.
func removeCgroupTree(dir string, self bool) error {
	var dirs []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && (self || p != dir) {
			dirs = append(dirs, p)
		}
		return nil
	})
	deadline := time.Now().Add(5 * time.Second)
	for i := len(dirs) - 1; i >= 0; i-- { // WalkDir is lexical, parents first: reverse is bottom-up
		for {
			err := syscall.Rmdir(dirs[i])
			if err == nil || errors.Is(err, syscall.ENOENT) {
				break
			}
			if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
				return fmt.Errorf("remove cgroup %s: %w (pids %v)", dirs[i], err, cgroupPIDs(dirs[i]))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

func isMountPoint(p string) (bool, error) {
	mps, err := mountinfo.Under(p)
	if err != nil {
		return false, err
	}
	for _, mp := range mps {
		if mp == p {
			return true, nil
		}
	}
	return false, nil
}

// unmount unmounts p, retrying briefly while busy, and detaches it as a last resort.
func unmount(p string) error {
	deadline := time.Now().Add(3 * time.Second)
	for {
		err := syscall.Unmount(p, 0)
		if err == nil || errors.Is(err, syscall.EINVAL) { // EINVAL: not a mount point any more
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			if derr := syscall.Unmount(p, syscall.MNT_DETACH); derr != nil {
				return fmt.Errorf("unmount %s: %v; detach: %w", p, err, derr)
			}
			return fmt.Errorf("unmount %s: %w; detached it lazily: whoever holds it keeps its memory", p, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
