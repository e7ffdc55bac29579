#!/usr/bin/env bash
# node-rootfs.sh: build, or reuse from the cache, the Debian root filesystem of
# a test-rig node machine (systemd + containerd + runc + CNI plugins), as a
# gzip tarball, and print its path on the last line of stdout.
#
#   scripts/node-rootfs.sh            build if needed
#   scripts/node-rootfs.sh --cached   only report: exit 3 when not built yet
#
# The tarball is what the rig's mirror serves to a node the way a real
# artifact server would; the kubelet binary is added separately.
#
# Cache: $KUBESLOT_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/kubeslot)
# /rootfs/node-<suite>-<key>.tar.gz (+ .sha256), where <key> hashes the suite,
# the package list, the masked units and ROOTFS_VERSION: change any of them
# and the next run builds a new tarball. Building takes about two minutes and
# needs root and debootstrap; everything is built in a temporary directory and
# moved into place at the end, so an interrupted run leaves nothing trusted.
#
# The Debian archive is the one this machine's apt uses (apt-get indextargets),
# or $KUBESLOT_DEBIAN_MIRROR; no archive host is named in this file.
set -euo pipefail

# Bump when the image content changes in a way the lists below don't show.
ROOTFS_VERSION=1
SUITE=${KUBESLOT_NODE_SUITE:-bookworm}
# minbase + what a kubelet node needs: systemd as init, containerd/runc, the
# CNI plugins (loopback), iptables and iproute2 (containerd and CNI use them),
# kmod (containerd.service runs modprobe), procps (kubelet reads /proc tools).
PACKAGES=systemd,systemd-sysv,dbus,libnss-systemd,containerd,runc,containernetworking-plugins,iptables,iproute2,ca-certificates,kmod,procps
# Units that make no sense in a node machine. networkd and friends matter most:
# rig nodes share a network namespace with their host, and a networkd there
# would manage the host's links. firstboot would prompt on a console nobody
# reads. The rest are gettys and periodic jobs that only add noise.
MASK="systemd-networkd.service systemd-networkd.socket systemd-networkd-wait-online.service
systemd-resolved.service systemd-timesyncd.service systemd-firstboot.service
getty.target console-getty.service container-getty@.service getty@.service serial-getty@.service
apt-daily.timer apt-daily-upgrade.timer apt-daily.service apt-daily-upgrade.service
e2scrub_all.timer e2scrub_reap.service fstrim.timer dpkg-db-backup.timer"

cache=${KUBESLOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubeslot}
outdir=$cache/rootfs
key=$(printf '%s\n' "$ROOTFS_VERSION" "$SUITE" "$PACKAGES" "$MASK" | sha256sum | cut -c1-12)
out=$outdir/node-$SUITE-$key.tar.gz
say() { echo "node-rootfs: $*" >&2; }

if [ -f "$out" ] && [ -f "$out.sha256" ]; then
	echo "$out"
	exit 0
fi
if [ "${1:-}" = --cached ]; then
	say "$out not built yet"
	exit 3
fi

[ "$(id -u)" = 0 ] || { say "must run as root (debootstrap)"; exit 1; }
command -v debootstrap >/dev/null || { say "debootstrap missing (apt-get install debootstrap)"; exit 1; }

mirror=${KUBESLOT_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
	# apt's own view of its sources (one-line and deb822 formats alike)
	mirror=$(apt-get indextargets --format '$(RELEASE) $(IDENTIFIER) $(REPO_URI)' |
		awk -v s="$SUITE" '$1 == s && $2 == "Packages" { print $3; exit }')
fi
[ -n "$mirror" ] || { say "no apt source for suite $SUITE; set KUBESLOT_DEBIAN_MIRROR"; exit 1; }

mkdir -p "$outdir"
work=$(mktemp -d "$outdir/.build-XXXXXX")
trap 'rm -rf --one-file-system "$work"' EXIT
root=$work/root
start=$(date +%s)
say "debootstrap $SUITE into $root (about 2 minutes)"
# in a private mount namespace: the /proc and /sys that debootstrap mounts in
# the target vanish with it, even when it fails half-way
if ! unshare --mount --propagation private debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$mirror" >"$work/debootstrap.log" 2>&1; then
	say "debootstrap failed; last lines of its log:"
	tail -30 "$work/debootstrap.log" >&2
	exit 1
fi

# apt caches and lists: ~90 MB nobody in a node needs
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/log/*.log "$root"/var/log/apt/*
# debootstrap copied this machine's identity: the node gets its own at start
: >"$root/etc/hostname"
: >"$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"
for u in $MASK; do
	ln -sfn /dev/null "$root/etc/systemd/system/$u"
done

# /dev, /proc, /sys are set up by systemd-nspawn; leave their mount points
tar -C "$root" --numeric-owner --xattrs --exclude=./dev/* --exclude=./proc/* --exclude=./sys/* \
	-czf "$work/rootfs.tar.gz" .
sum=$(sha256sum "$work/rootfs.tar.gz" | cut -d' ' -f1)
printf '%s  %s\n' "$sum" "$(basename "$out")" >"$work/rootfs.tar.gz.sha256"
mv "$work/rootfs.tar.gz" "$out"
mv "$work/rootfs.tar.gz.sha256" "$out.sha256"
say "built $(basename "$out") ($(du -h "$out" | cut -f1)) in $(($(date +%s) - start))s"
echo "$out"
