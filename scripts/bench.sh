#!/usr/bin/env bash
# bench.sh: `make bench`. One go test run of the rig that measures every stage target (bootstrap to reset) and
# the agent's idle cost, then one table of the figures (scripts/benchtable) with the targets next to them. Figures
# are printed, never asserted: the run fails only when a test or benchmark fails, and the table is printed anyway,
# with "n/a (not measured: <why>)" for what is missing.
#
#   scripts/bench.sh
#
# What runs (one test binary, one control plane):
#   tests       TestBootstrapOnRig (bootstrap to Node Ready, re-run), TestRepaveOnRig (node downtime and its floor,
#               a kubelet stop + start in the serving node; slot prepare vs cp -a, whole repave),
#               TestOverlaySlotsOnRig (a layered slot's preparation at two rootfs sizes beside cp -a of the same
#               tree), TestResetOnRig (reset), TestWatcherOnRig (reaction latency), TestUpgrade*
#               (upgrade, rollback; matched loosely, may not exist yet), TestPodsOnRig (workload downtime across a
#               restart and three repaves, the median printed, from a probe outside the node; Node Ready -> pods Ready),
#               TestKubernetesUpgradeOnRig (workload downtime across a kubelet 1.37.1 -> 1.37.2 patch in place, and a repave), TestWatcherIdleOnRig
#               (the idle figure: the watcher in kubeslot-watcher.service on a bootstrapped host, with the node identity
#               the bootstrap left, its requests counted at the apiserver from its audit log by user and user agent),
#               TestRolloutOnRig (a paced Repave of three real hosts with pods, one at a time, against the sum of the
#               same three repaves; ~10 minutes)
#   benchmarks  BenchmarkFleet (N in-process watchers on the same node identity path against one apiserver, counted at
#               their transports and in the audit log), BenchmarkWatcherIdle (the real kubeslot-watcher binary's RSS
#               and audit-counted requests, started by the test rather than by its unit), BenchmarkAgentAdmission (an
#               agent's Machine create and operation status write with 0..2000 other Machines: admission's cost),
#               BenchmarkRolloutWait (N in-process agents on one Repave with maxUnavailable 1, the slot held: the
#               join's status writes and admission, then requests and apiserver CPU per agent waiting for a slot)
# Without -race, unlike make test-integration: the race detector inflates the in-process fleet's memory and CPU.
#
# Environment (defaults in brackets):
#   KUBESLOT_BENCH_OUT      directory for go-test.log and figures.jsonl [a new /tmp/kubeslot-bench.XXXXXX]
#   KUBESLOT_BENCH_TESTS    go test -run pattern [the tests above]
#   KUBESLOT_BENCH_BENCHES  go test -bench pattern [^(BenchmarkFleet|BenchmarkWatcherIdle|BenchmarkAgentAdmission|BenchmarkRolloutWait)$]
#   KUBESLOT_ROLLOUT_N      BenchmarkRolloutWait's fleet sizes [20,200]: requests per waiting agent must not grow with N
#   KUBESLOT_FLEET_N        fleet sizes, comma-separated [1,200,1000]: the per-agent figures side by side
#   KUBESLOT_BENCH_WINDOW, KUBESLOT_BENCH_BASELINE, KUBESLOT_BENCH_SETTLE  idle window [60s], apiserver baseline
#                           window [30s], pause before each [10s] (integration/bench/bench_fleet_test.go)
#   KUBESLOT_KUBE_BIN, KUBESLOT_REQUIRE_RIG  as for make test-integration
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}

out=${KUBESLOT_BENCH_OUT:-$(mktemp -d /tmp/kubeslot-bench.XXXXXX)}
mkdir -p "$out"
log=$out/go-test.log
figures=$out/figures.jsonl
: >"$figures"
tests=${KUBESLOT_BENCH_TESTS:-'^(TestBootstrapOnRig|TestRepaveOnRig|TestOverlaySlotsOnRig|TestResetOnRig|TestWatcherOnRig|TestUpgrade.*|TestPodsOnRig|TestKubernetesUpgradeOnRig|TestWatcherIdleOnRig|TestRolloutOnRig)$'}
benches=${KUBESLOT_BENCH_BENCHES:-'^(BenchmarkFleet|BenchmarkWatcherIdle|BenchmarkAgentAdmission|BenchmarkRolloutWait)$'}

export KUBESLOT_FIGURES_FILE=$figures
export KUBESLOT_FLEET_N=${KUBESLOT_FLEET_N:-1,200,1000}
if [ "$(id -u)" = 0 ]; then
	export KUBESLOT_REQUIRE_RIG=${KUBESLOT_REQUIRE_RIG:-1}
fi
KUBESLOT_KUBE_BIN=${KUBESLOT_KUBE_BIN:-$(scripts/kube-bins.sh)}
KUBESLOT_KUBE_BIN_PREV=${KUBESLOT_KUBE_BIN_PREV:-$(scripts/kube-bins.sh --prev kubelet)}
export KUBESLOT_KUBE_BIN KUBESLOT_KUBE_BIN_PREV

# The fleet at N=1000 adds some 3 minutes (baseline, registration, idle window, clean-up; DESIGN.md, "Test rig");
# the rollout wait at N=200 up to 15 (its join is bounded by 10 minutes: DESIGN.md, "Paced rollouts");
# the three-host rollout on the rig some 7.
echo "bench: full log in $log, figures in $figures (about 60 minutes)"
# The terminal gets the progress lines only: test starts and results, the rig's timings, benchmark results.
set +e
$GO test -count=1 -p 1 -timeout 100m -v -run "$tests" -bench "$benches" -benchtime 1x ./integration/... 2>&1 |
	tee "$log" |
	grep --line-buffered -E '^(=== RUN +[^/]+$|--- (PASS|FAIL|SKIP)|rig: |Benchmark[^ ]+ |ok |FAIL|PASS)'
rc=${PIPESTATUS[0]}
set -e

echo
echo "kubeslot bench ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs):"
$GO run ./scripts/benchtable -figures "$figures" -log "$log"
echo
if [ "$rc" -ne 0 ]; then
	echo "bench: go test failed (exit $rc); see $log" >&2
fi
exit "$rc"
