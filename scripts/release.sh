#!/usr/bin/env bash
# release.sh: `make release`. The artifacts of one release, for linux/amd64 and linux/arm64, in dist/release/<version>/:
#
#   kubeslot-<version>-linux-<arch>/<binary>   the six binaries (static, -trimpath, no build ID, version stamped)
#   kubeslot-<version>-linux-<arch>.tar.gz     the same directory as one download, for installing a host
#   kubeslot-<version>-<arch>.tar.gz           the agent bundle (`kubeslot bundle create`), what AgentUpgrade installs
#   kubeslot-<version>-cluster.yaml            the cluster side (`kubeslot cluster manifests`), when the CLI has it
#   kubeslot-<version>-<arch>.tar.gz.minisig   with KUBESLOT_SIGNING_KEY: the bundles' minisign signatures
#   SHA256SUMS                                 sha256sum's format, of every file above
#
# Reproducible: the same tree gives the same bytes (SOURCE_DATE_EPOCH is the commit's time; no paths, build IDs or
# clocks get in). scripts/release-check.sh builds twice from two checkouts and compares.
#
#   scripts/release.sh [version]        (default: git describe, as make build stamps)
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
version=${1:-$(git describe --tags --always --dirty 2>/dev/null || echo devel)}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 1)}
out=${KUBESLOT_RELEASE_OUT:-dist/release/$version}
binaries=(kubeslot kubeslot-bootstrap kubeslot-watcher kubeslot-repaver kubeslot-upgrader kubeslot-resetter)
ldflags="-s -w -buildid= -X github.com/kubeslot/kubeslot/lib/buildinfo.Version=$version"

rm -rf "$out"
mkdir -p "$out"
for arch in amd64 arm64; do
	dir=$out/kubeslot-$version-linux-$arch
	mkdir -p "$dir"
	for b in "${binaries[@]}"; do
		CGO_ENABLED=0 GOOS=linux GOARCH=$arch $GO build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$dir/$b" "./cmd/$b"
	done
done
# The bundles and the manifests are written by this machine's own build of the CLI.
host=$out/.host
mkdir -p "$host"
CGO_ENABLED=0 $GO build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$host/kubeslot" ./cmd/kubeslot
for arch in amd64 arm64; do
	"$host/kubeslot" bundle create --bins "$out/kubeslot-$version-linux-$arch" --units units --release-version "$version" \
		--arch "$arch" --out "$out/kubeslot-$version-$arch.tar.gz" >/dev/null
done
for arch in amd64 arm64; do
	name=kubeslot-$version-linux-$arch
	tar -C "$out" --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner -cf - "$name" |
		gzip -n >"$out/$name.tar.gz"
done
if "$host/kubeslot" cluster manifests --help >/dev/null 2>&1; then
	"$host/kubeslot" cluster manifests >"$out/kubeslot-$version-cluster.yaml"
fi
rm -rf "$host"
# Signed with the operator's minisign key when KUBESLOT_SIGNING_KEY names it (minisign asks for its password): a
# host whose [upgrade] trusted_keys names the public key accepts only bundles with such a <bundle>.minisig.
if [ -n "${KUBESLOT_SIGNING_KEY:-}" ]; then
	minisign -S -s "$KUBESLOT_SIGNING_KEY" -m "$out"/kubeslot-"$version"-*.tar.gz
fi
(cd "$out" && find . -type f ! -name SHA256SUMS | sed 's|^\./||' | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)
echo "release $version in $out:"
cat "$out/SHA256SUMS"
