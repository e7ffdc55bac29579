#!/bin/sh
# Written by kubeslot from [node] preload_images; it is rewritten on every configure.
#
# preload.sh LIST RECORDS [COMPLETE] imports each image archive named in LIST
# into containerd's k8s.io namespace. Both slots share containerd's state, so
# an archive imported by an earlier start is there already, and importing it
# again would sit inside a repave's or restart's downtime: after an import, a
# record in RECORDS (keyed by the snapshotter and the archive's path, which
# the artifact cache names by digest) lists the images it brought, and a
# later start skips the archive while all of them are still in containerd.
# An archive whose import named no image is imported every time.
#
# When every archive has a record, it touches COMPLETE (named by the list):
# the unit before the kubelet is skipped while it exists, and the same script
# then runs beside the kubelet instead. A failed run removes it.
set -u
list=$1
records=$2
complete=${3:-}
snapshotter=${CONTAINERD_SNAPSHOTTER:-overlayfs}
fail() {
	[ -z "$complete" ] || rm -f "$complete"
	exit 1
}
mkdir -p "$records" || fail
have=
listed=false
all=true
while read -r f; do
	[ -n "$f" ] || continue
	rec="$records/$snapshotter$(printf '%s' "$f" | tr / _)"
	if [ -s "$rec" ]; then
		if ! $listed; then
			have=$(ctr --namespace k8s.io images ls -q) || fail
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
	[ "$status" -eq 0 ] || fail
	# ctr prints "unpacking NAME (DIGEST)...done" for each image.
	printf '%s\n' "$out" | sed -n 's/^unpacking \([^ ]*\) .*/\1/p' > "$rec.tmp" && mv "$rec.tmp" "$rec" || fail
	[ -s "$rec" ] || all=false
done < "$list"
if [ -n "$complete" ]; then
	if $all; then
		touch "$complete" || exit 1
	else
		rm -f "$complete"
	fi
fi
