#!/usr/bin/env bash
# deps.sh: install the Debian packages the rig and the demo need. Idempotent
# and quiet when everything is already there; needs root only when something
# is missing.
set -euo pipefail

# systemd-container: systemd-nspawn, machinectl, machined (node machines)
# debootstrap: builds the cached node rootfs (scripts/node-rootfs.sh)
# iproute2, iptables, nftables: the leak check reads links and rules
# util-linux: unshare, nsenter (isolated hosts); kmod: modprobe in nodes
packages=(systemd-container debootstrap iproute2 iptables nftables util-linux kmod ca-certificates)

missing=()
for p in "${packages[@]}"; do
	status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
	[ "$status" = "install ok installed" ] || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
	echo "deps: missing Debian packages: ${missing[*]}; run as root or: apt-get install ${missing[*]}" >&2
	exit 1
fi
echo "deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
	cat "$log" >&2
	echo "deps: apt-get failed" >&2
	exit 1
fi
