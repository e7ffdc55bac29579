#!/bin/bash
# host-init.sh — first process of an isolated systemd "host" of the kubeslot test rig.
#
# integration/sdhost starts it as PID 1 of fresh pid/mount/uts/ipc/cgroup (and, unless the network is shared, net)
# namespaces: `unshare ... --propagation private --kill-child host-init.sh [ro|rw SRC DST]...`. It builds the host's
# root (overlay: the machine's / read-only below, a tmpfs "disk" above), mounts the API filesystems the way
# systemd-nspawn would, pivots into the root and ends with `exec systemd`. Everything mounted here lives in the private
# mount namespace and disappears with it; the only machine-side mount (a persistent disk) is made and removed by Go.
#
# Environment (set by sdhost; nothing else is inherited):
#   RIG_NAME     host name (also the hostname, via the skeleton's /etc/hostname)
#   RIG_STATE    the host's state dir on the machine: root/ (overlay mount point), console.log, rw/ (private disk)
#   RIG_SKEL     a fresh disk: upper/ (masks, journald/system.conf drop-ins, /.oldroot, hostname) and an empty work/
#   RIG_DEVSKEL  the host's /dev: the harmless device nodes (null zero full random urandom tty), symlinks, dirs
#   RIG_DISK     dir holding upper/ and work/ that outlives the host (a machine-side tmpfs); empty: a private tmpfs
#   RIG_CGROUP   hybrid | unified: which cgroup layout the host's systemd gets
#   RIG_DISK_SIZE  size= of the private tmpfs
#   RIG_V1_CONTROLLERS  (hybrid only) v1 controllers to mount, each alone at /sys/fs/cgroup/<controller>; sdhost has
#                put this process in the host's own dir of each, so the cgroup namespace shows only that subtree
#   RIG_KEEP_MKNOD  1: CAP_MKNOD stays in the bounding set (container runtimes create device nodes)
# Arguments: bind mounts from the machine, as triples MODE SRC DST (MODE ro or rw, DST a path inside the host).
#
# Forks cost 12-40 ms on the CI machines: this script uses bash builtins wherever it can (~25 external commands).
set -eu
: "${RIG_NAME:?}" "${RIG_STATE:?}" "${RIG_SKEL:?}" "${RIG_DEVSKEL:?}" "${RIG_CGROUP:?}"
R=$RIG_STATE/root

# 1. The disk: upper and work dirs of the overlay. overlayfs refuses them on the lower's filesystem (ELOOP,
#    overlapping layers), hence tmpfs. A disk without upper/ is new: it gets the skeleton, and the lower's own
#    enabled units are whited out once (a persistent disk keeps whatever the host enabled later, like a real one).
disk=${RIG_DISK:-}
if [ -z "$disk" ]; then
  disk=$RIG_STATE/rw
  mount -t tmpfs -o "mode=0755,size=${RIG_DISK_SIZE:-4g}" "rig-disk-$RIG_NAME" "$disk"
fi
fresh=0
if [ ! -d "$disk/upper" ]; then
  fresh=1
  # cp -a DIR/. also copies DIR's own mode onto the target: every dir of the skeleton is 0755 (a 0700 "/" kills
  # dbus-daemon, which runs as messagebus, and the boot hangs).
  cp -a "$RIG_SKEL/." "$disk/"
fi
# overlayfs clears its own work/work on every mount, so a work dir left by a killed host needs no cleanup.
mount -t overlay "rig-root-$RIG_NAME" -o "lowerdir=/,upperdir=$disk/upper,workdir=$disk/work" "$R"
if [ "$fresh" = 1 ]; then
  # Whiteout of everything the machine enabled (postgresql, timers, containerd, ...); /lib's static wants stay.
  rm -rf "$R"/etc/systemd/system/*.wants "$R"/etc/systemd/system/*.requires
  read -r uuid < /proc/sys/kernel/random/uuid
  echo "${uuid//-/}" > "$R/etc/machine-id"
fi

# /var/lib/machines on the disk itself: a slot's rootfs is an overlay whose upper must not be on overlayfs (the host's
# root is one), and its lower (the clean tree under /opt/kubeslot, on the root overlay) is then at depth 2, the limit.
# A real host's /var/lib/machines is a plain directory on a real disk; nothing in production needs this.
mkdir -p -m 0700 "$disk/machines" "$R/var/lib/machines"
mount --bind "$disk/machines" "$R/var/lib/machines"

# 2. API filesystems.
mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
# sysctls are global (net.* too when the network is shared): read-only, so nothing inside can change the machine's.
mount -o bind,ro,nosuid,nodev,noexec "$R/proc/sys" "$R/proc/sys"
if [ -e "$R/proc/sysrq-trigger" ]; then mount -o bind,ro "$R/proc/sysrq-trigger" "$R/proc/sysrq-trigger"; fi
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$R/sys"
# cgroups, prepared so that systemd never mounts the machine's v1 controllers itself (it would, read-write and rooted
# at the machine's tree). We are in a cgroup namespace rooted at this host's dirs, so each mount shows only them.
case $RIG_CGROUP in
  hybrid)
    mount -t tmpfs -o mode=0755,nosuid,nodev,noexec,size=1m rig-cgroup "$R/sys/fs/cgroup"
    mkdir "$R/sys/fs/cgroup/systemd" "$R/sys/fs/cgroup/unified"
    mount -t cgroup -o none,name=systemd,nosuid,nodev,noexec cgroup "$R/sys/fs/cgroup/systemd"
    mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$R/sys/fs/cgroup/unified"
    # The controllers, read-write, as the machine has them: systemd finds them mounted and uses them (full hybrid
    # mode); the mount points exist before the tmpfs goes read-only, so it mounts nothing of its own.
    for c in ${RIG_V1_CONTROLLERS:-}; do
      mkdir "$R/sys/fs/cgroup/$c"
      mount -t cgroup -o "$c,nosuid,nodev,noexec" cgroup "$R/sys/fs/cgroup/$c"
    done
    mount -o remount,ro,bind "$R/sys/fs/cgroup" ;;
  unified)
    if [ -n "${RIG_V1_CONTROLLERS:-}" ]; then echo "host-init: RIG_V1_CONTROLLERS needs RIG_CGROUP=hybrid" >&2; exit 1; fi
    mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$R/sys/fs/cgroup" ;;
  *) echo "host-init: RIG_CGROUP=$RIG_CGROUP: want hybrid or unified" >&2; exit 1 ;;
esac
# /dev: a small tmpfs holding the harmless device nodes (made by sdhost, copied: one fork instead of one bind mount
# per node), a private devpts, /dev/console = console.log.
mount -t tmpfs -o mode=0755,nosuid,size=1m "rig-dev-$RIG_NAME" "$R/dev"
cp -a "$RIG_DEVSKEL/." "$R/dev/"
mount --bind "$RIG_STATE/console.log" "$R/dev/console"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,gid=5 devpts "$R/dev/pts"
mount -t tmpfs -o mode=1777,nosuid,nodev "rig-shm-$RIG_NAME" "$R/dev/shm"
# A private /tmp: the lower is the machine's own /, whose /tmp holds other people's files.
mount -t tmpfs -o mode=1777,nosuid,nodev "rig-tmp-$RIG_NAME" "$R/tmp"

# 3. Bind mounts from the machine.
while [ $# -ge 3 ]; do
  mode=$1 src=$2 dst=$R$3; shift 3
  if [ -d "$src" ]; then mkdir -p "$dst"; else mkdir -p "${dst%/*}"; : >> "$dst"; fi
  if [ "$mode" = ro ]; then mount -o bind,ro "$src" "$dst"; else mount --bind "$src" "$dst"; fi
done

# 4. Enter the root (the skeleton provides /.oldroot) and drop the machine's tree.
cd "$R"
pivot_root . .oldroot
umount -l /.oldroot
cd /

# 5. systemd as PID 1. `container=` (set by sdhost) makes it run as in a container: no udev, no hardware units.
#    The bounding set is trimmed like a container's; CAP_SYS_BOOT stays: reboot(2) from a child pid namespace only ends
#    the namespace, and systemd-shutdown needs it (without it, poweroff hangs in freeze()).
#    No --log-target=console: PID 1's own messages (restart jobs, start limits) belong in the journal.
drop=-sys_module,-sys_time,-sys_rawio,-mknod,-wake_alarm,-block_suspend,-syslog
if [ "${RIG_KEEP_MKNOD:-}" = 1 ]; then drop=${drop/,-mknod/}; fi
unset "${!RIG_@}"
exec setpriv --bounding-set="$drop" /lib/systemd/systemd --system --unit=multi-user.target --show-status=no
