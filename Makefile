# kubeslot: build, test and demo. See README.md for the two commands that
# matter (make demo, make test) and DESIGN.md for how the pieces fit.

SHELL := /bin/bash
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS := -s -w -X github.com/kubeslot/kubeslot/lib/buildinfo.Version=$(VERSION)
BINARIES := kubeslot kubeslot-bootstrap kubeslot-watcher kubeslot-repaver kubeslot-upgrader kubeslot-resetter
export GOFLAGS ?= -buildvcs=false
# Go's caches and ours live under $HOME; a CI runner may start without it.
export HOME ?= $(shell getent passwd "$$(id -u)" | cut -d: -f6)

# The rig's tests must run wherever they can: as root they are required (a
# missing piece fails the run instead of skipping it); elsewhere they skip
# with the reason.
ifeq ($(shell id -u),0)
export KUBESLOT_REQUIRE_RIG ?= 1
endif

.PHONY: all build bundle release test-release generate manifests deps kube-bins node-rootfs test test-unit test-demo test-integration bench soak fmt-check vet lint demo clean

all: build

build:
	@mkdir -p bin
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/ $(addprefix ./cmd/,$(BINARIES))

# The release bundle (binaries, unit templates, manifest) the upgrader
# installs; prints "<sha256>  <path>".
bundle: build
	bin/kubeslot bundle create --bins bin --units units --release-version $(VERSION) --out dist/kubeslot-$(VERSION)-$$($(GO) env GOARCH).tar.gz

# A release (scripts/release.sh): binaries, agent bundles and cluster manifests for linux/amd64 and arm64, with
# SHA256SUMS, in dist/release/<version>/; reproducible (test-release builds it twice and compares).
release:
	@scripts/release.sh $(VERSION)

test-release:
	@scripts/release-check.sh

# Regenerate lib/api/v1alpha1's deep copies and CRDs with the pinned
# controller-gen (fetched through the Go module proxy). A test fails when the
# committed files are stale.
generate:
	$(GO) generate ./lib/api/...

# The kustomize base deploy/ (kubectl apply -k deploy/): what `kubeslot cluster install` applies, written by
# `kubeslot cluster manifests --kustomize`. A test fails when the committed files are stale.
manifests:
	rm -f deploy/*.yaml
	$(GO) run ./cmd/kubeslot cluster manifests --kustomize deploy

# Everything the tests and the demo need on this machine, cached across runs:
# Debian packages, the Kubernetes and etcd binaries (built from source through
# the Go module proxy, ~16 min the first time), and the node rootfs tarball.
deps: kube-bins node-rootfs

kube-bins:
	@scripts/deps.sh
	@scripts/kube-bins.sh >/dev/null
	@scripts/kube-bins.sh --prev kubelet >/dev/null

node-rootfs:
	@scripts/deps.sh
	@scripts/node-rootfs.sh >/dev/null

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

# staticcheck (honnef.co/go/tools), pinned, with its default checks (none
# disabled, so no staticcheck.conf). It is built once through the Go module
# proxy into the cache scripts/kube-bins.sh uses, keyed by version, so a clean
# machine needs nothing but Go. Cost measured on this 2-CPU machine: cold
# (staticcheck not built, its cache empty, Go's build cache warm as vet leaves
# it) 80 s; warm, nothing changed, 1.5 s; after an edit only the edited
# packages and their importers are analysed again (up to ~50 s for one that
# everything imports). With Go's build cache empty as well: about 7 min.
STATICCHECK_VERSION := v0.8.2
KUBESLOT_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/kubeslot
STATICCHECK := $(KUBESLOT_CACHE)/bin/staticcheck-$(STATICCHECK_VERSION)/staticcheck

lint: $(STATICCHECK)
	$(STATICCHECK) ./...

$(STATICCHECK):
	@mkdir -p $(@D)
	GOBIN=$(@D)/.part $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(@D)/.part/staticcheck $@ && rmdir $(@D)/.part

test: fmt-check vet lint deps build test-unit test-release test-demo test-integration

# Fast tests: no root, no rig.
test-unit:
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v /integration)

# Whole-system tests on the rig: isolated systemd hosts, a real control plane,
# real nspawn node machines. One test binary per subject package (integration/node,
# integration/repave, ...), one at a time (-p 1); -timeout bounds each binary.
test-integration:
	KUBESLOT_KUBE_BIN=$$(scripts/kube-bins.sh) KUBESLOT_KUBE_BIN_PREV=$$(scripts/kube-bins.sh --prev kubelet) $(GO) test -race -count=1 -p 1 -timeout 70m $$($(GO) list ./... | grep /integration)

# The performance suite: the rig tests that measure the stage targets and the fleet benchmarks in one
# run, then one table of the figures with the targets next to them (scripts/bench.sh; ~30 minutes, ~10 of them the
# three-host rollout).
bench:
	@scripts/bench.sh

# The chaos test (integration/soak/soak_test.go): SOAK_ROUNDS rounds of random operations on one rig host (spec
# repave, NodeRestart, AgentUpgrade, AgentReset + a fresh bootstrap), each with a kill -9 of a random kubeslot process
# at a random moment and a power cut in one round of every four; the host's invariants are checked after each round,
# and a table of the rounds is printed. TestSoak skips unless KUBESLOT_SOAK_ROUNDS is set, so make test does not run
# it. SOAK_SEED=<seed> replays a plan (the seed is printed at the start). Run from integration/soak/ so that the
# progress lines stream (go test's local directory mode); about 1-2 minutes per round.
SOAK_ROUNDS ?= 30
SOAK_SEED ?=
soak: deps
	cd integration/soak && KUBESLOT_SOAK_ROUNDS=$(SOAK_ROUNDS) $(if $(SOAK_SEED),KUBESLOT_SOAK_SEED=$(SOAK_SEED)) \
		KUBESLOT_KUBE_BIN=$$(../../scripts/kube-bins.sh) $(GO) test -count=1 -timeout $$(( $(SOAK_ROUNDS) * 10 + 30 ))m -run '^TestSoak$$'

# The whole life cycle on this machine (integration/demo): a local control plane, an isolated systemd host, the
# real binaries and units; a timeline with durations, everything cleaned up at the end (also on Ctrl-C).
# make demo KEEP=1 stops before the reset, keeps the rig running and prints how to reach it. make test runs the same
# life cycle (test-demo: the same command without KEEP), so CI fails whenever the demo would.
KEEP ?=
DEMO_RUN = $(GO) run ./integration/demo -bins bin \
		-kube-bin "$$(scripts/kube-bins.sh | tail -1)" \
		-kube-prev-bin "$$(scripts/kube-bins.sh --prev kubelet | tail -1)" \
		-kubectl "$$(scripts/kube-bins.sh kubectl | tail -1)/kubectl" \
		-node-rootfs "$$(scripts/node-rootfs.sh | tail -1)" \
		-bundle dist/kubeslot-$(VERSION)-$$($(GO) env GOARCH).tar.gz
demo: deps build bundle
	@$(DEMO_RUN) $(if $(filter 1,$(KEEP)),-keep)

test-demo: deps build bundle
	@$(DEMO_RUN)

clean:
	rm -rf bin dist
