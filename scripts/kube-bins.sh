#!/usr/bin/env bash
# kube-bins.sh: build, or reuse from the cache, the Kubernetes and etcd
# binaries the test rig runs, and print the directory that holds them.
#
#   scripts/kube-bins.sh [--prev] [component ...]
#     components: kube-apiserver kube-controller-manager kubelet etcd kubectl
#     (default: the four the tests run; `make demo` adds kubectl)
#     --prev: build for KUBE_PREV_VERSION, the earlier release a node starts
#     on in the Kubernetes-upgrade test (only its kubelet is needed)
#
# Kubernetes publishes no `go install`-able main module (k8s.io/kubernetes
# replaces its staging modules with ./staging paths that are not in the module
# zip), so we build from a throw-away module that requires k8s.io/kubernetes
# and pins each staging module to its published v0.x tag. etcd's server module
# has the same problem (replace => ../api), solved the same way.
#
# Cache: $KUBESLOT_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/kubeslot),
# keyed by version, outside the work tree so a fresh clone on the same machine
# reuses it. A binary is reused only when its stamp file exists, so an
# interrupted build is redone rather than trusted.
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-1.37.2}
KUBE_PREV_VERSION=${KUBE_PREV_VERSION:-1.37.1}
if [ "${1:-}" = --prev ]; then
	KUBE_VERSION=$KUBE_PREV_VERSION
	shift
fi
ETCD_VERSION=${ETCD_VERSION:-3.7.3}
cache=${KUBESLOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubeslot}
bindir=$cache/bin/k8s-$KUBE_VERSION-etcd-$ETCD_VERSION
mkdir -p "$bindir"

want=("$@")
[ ${#want[@]} -gt 0 ] || want=(kube-apiserver kube-controller-manager kubelet etcd)

have() { [ -x "$bindir/$1" ] && [ -f "$bindir/.$1.ok" ]; }
say() { echo "kube-bins: $*" >&2; }

build_etcd() {
	local mod=$cache/mod/etcd-$ETCD_VERSION
	mkdir -p "$mod"
	(
		cd "$mod"
		[ -f go.mod ] || printf 'module kubeslot.local/etcd\n\ngo 1.26.0\n' >go.mod
		[ -f doc.go ] || printf 'package etcd\n' >doc.go
		go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" >&2
		CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bindir/etcd.part" go.etcd.io/etcd/server/v3
	)
	mv "$bindir/etcd.part" "$bindir/etcd"
	touch "$bindir/.etcd.ok"
}

kube_module() {
	local mod=$1 kdir minor patch
	mkdir -p "$mod"
	[ -f "$mod/go.mod" ] && return 0
	go mod download -json "k8s.io/kubernetes@v$KUBE_VERSION" >/dev/null
	kdir=$(go env GOMODCACHE)/k8s.io/kubernetes@v$KUBE_VERSION
	minor=$(echo "$KUBE_VERSION" | cut -d. -f2)
	patch=$(echo "$KUBE_VERSION" | cut -d. -f3)
	{
		printf 'module kubeslot.local/k8s\n\n'
		grep -m1 '^go ' "$kdir/go.mod"
		printf '\nrequire k8s.io/kubernetes v%s\n\nreplace (\n' "$KUBE_VERSION"
		# one pin per staging module that kubernetes' own go.mod replaces
		sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\t\1 => \1 v0.'"$minor.$patch"'#p' "$kdir/go.mod"
		printf ')\n'
	} >"$mod/go.mod.part"
	printf 'package k8s\n' >"$mod/doc.go"
	mv "$mod/go.mod.part" "$mod/go.mod"
}

build_kube() {
	local mod=$cache/mod/k8s-$KUBE_VERSION major minor ldflags pkg
	kube_module "$mod"
	major=$(echo "$KUBE_VERSION" | cut -d. -f1)
	minor=$(echo "$KUBE_VERSION" | cut -d. -f2)
	ldflags="-s -w"
	# Without the stamps the binaries report v0.0.0-master, and kubelet's
	# version skew checks misbehave.
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X $pkg.gitVersion=v$KUBE_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
		ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
	done
	(
		cd "$mod"
		# pinned: a bare `go get` would move to the newest release
		go get "k8s.io/kubernetes/cmd/$1@v$KUBE_VERSION" >&2
		# CGO_ENABLED=0 for kubelet too: it works for our use and shares the
		# build cache with kube-apiserver, minutes faster than a cgo build.
		CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bindir/$1.part" "k8s.io/kubernetes/cmd/$1"
	)
	mv "$bindir/$1.part" "$bindir/$1"
	touch "$bindir/.$1.ok"
}

# One build at a time per cache: two runs (a test beside `make demo`, or two
# checkouts on one machine) would otherwise edit the same throw-away module
# and write the same output file at once.
exec 9>"$cache/.kube-bins.lock"
flock 9

for c in "${want[@]}"; do
	have "$c" && continue
	start=$(date +%s)
	say "building $c (first time on this machine: minutes)"
	case $c in
	etcd) build_etcd ;;
	kube-apiserver | kube-controller-manager | kubelet | kubectl) build_kube "$c" ;;
	*) say "unknown component $c"; exit 2 ;;
	esac
	say "built $c in $(($(date +%s) - start))s"
done
echo "$bindir"
