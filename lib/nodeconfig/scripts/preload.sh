#!/bin/sh
# Written by kubeslot from [node] preload_images; it is rewritten on every configure.
#
# preload.sh LIST RECORDS imports each image archive named in LIST into
# containerd's k8s.io namespace. Both slots share containerd's state, so an
# archive imported by an earlier start is there already, and importing it
# again would sit inside a repave's or restart's downtime: after an import, a
# record in RECORDS (keyed by the snapshotter and the archive's path, which
# the artifact cache names by digest) lists the images it brought, and a
# later start skips the archive while all of them are still in containerd.
# An archive whose import named no image is imported every time.
#
# With PRELOAD_VERIFY_UNIT set and every archive recorded, it only queues
# that unit, which runs preload.sh --verify LIST RECORDS (the check and any
# import) beside the kubelet's start instead of before it.
set -u
verify=false
if [ "${1:-}" = --verify ]; then
	verify=true
	shift
fi
list=$1
records=$2
snapshotter=${CONTAINERD_SNAPSHOTTER:-overlayfs}
mkdir -p "$records" || exit 1
record() { printf '%s/%s%s' "$records" "$snapshotter" "$(printf '%s' "$1" | tr / _)"; }
if ! $verify && [ -n "${PRELOAD_VERIFY_UNIT:-}" ]; then
	all=true
	while read -r f; do
		[ -n "$f" ] || continue
		[ -s "$(record "$f")" ] || all=false
	done < "$list"
	if $all && systemctl start --no-block "$PRELOAD_VERIFY_UNIT"; then
		echo "every archive was imported before: checked beside the kubelet by $PRELOAD_VERIFY_UNIT"
		exit 0
	fi
fi
have=
listed=false
while read -r f; do
	[ -n "$f" ] || continue
	rec=$(record "$f")
	if [ -s "$rec" ]; then
		if ! $listed; then
			have=$(ctr --namespace k8s.io images ls -q) || exit 1
			listed=true
		fi
		missing=false
		while read -r ref; do
			printf '%s\n' "$have" | grep -qxF -e "$ref" || missing=true
		done < "$rec"
		if ! $missing; then
			echo "already imported: $f"
			continue
		fi
	fi
	echo "importing $f"
	out=$(ctr --namespace k8s.io images import "$f")
	status=$?
	printf '%s\n' "$out"
	[ "$status" -eq 0 ] || exit 1
	# ctr prints "unpacking NAME (DIGEST)...done" for each image.
	printf '%s\n' "$out" | sed -n 's/^unpacking \([^ ]*\) .*/\1/p' > "$rec.tmp" && mv "$rec.tmp" "$rec" || exit 1
done < "$list"
