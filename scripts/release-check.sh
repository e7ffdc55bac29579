#!/usr/bin/env bash
# release-check.sh: the release is reproducible. Builds it twice, from this tree and from a copy of it at another
# path, and compares SHA256SUMS: any byte that depends on where or when it was built fails the check, naming the
# files that differ. The two builds share the Go build cache (its keys hold the package's path, so kubeslot's own
# packages compile again from the copy; the dependencies, the same files in the module cache, do not), which keeps
# the check inside make test's time.
#
#   scripts/release-check.sh            (make test runs it as test-release)
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
version=check-$(git rev-parse --short HEAD 2>/dev/null || echo tree)
work=$(mktemp -d /tmp/kubeslot-release-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 1)}

# The second tree: the tracked files and the working changes, at another path.
mkdir -p "$work/tree"
git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$work/tree"

KUBESLOT_RELEASE_OUT=$work/one scripts/release.sh "$version" >/dev/null
(cd "$work/tree" && KUBESLOT_RELEASE_OUT=$work/two scripts/release.sh "$version" >/dev/null)
if ! diff -u "$work/one/SHA256SUMS" "$work/two/SHA256SUMS"; then
	echo "release-check: two builds of the same tree differ (above)" >&2
	exit 1
fi
echo "release-check: two builds from two paths are identical ($(wc -l <"$work/one/SHA256SUMS") files)"
