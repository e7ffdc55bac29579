package main

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// BenchmarkRolloutWait (integration/bench/bench_rollout_test.go) records each figure once per fleet size, as
// "rollout wait N=<n>: <metric>": a paced rollout's coordination cost, N-1 agents waiting for the one slot. As for the
// fleet, one line per metric with the sizes side by side, and one derived line: the requests per minute per waiting
// agent at the largest size over the smallest, whose target is that they do not grow with N.

var rolloutName = regexp.MustCompile(`^rollout wait N=([0-9]+): (.+)$`)

const (
	rolloutReq   = "requests per minute per waiting agent (apiserver counters, idle fleet subtracted)"
	rolloutCPU   = "apiserver CPU per waiting agent (idle fleet subtracted)"
	rolloutNoise = "apiserver CPU per waiting agent, noise of the idle fleet"
)

var rolloutTargets = map[string]string{
	rolloutReq: "flat in N (one List of the leases per 10 s: 6)",
	"requests per minute per waiting agent besides watches (apiserver audit, holder left out)": "flat in N (6)",
	rolloutCPU: "flat in N",
	"admission policies' time per admitted status write (join)":          "no run per Machine",
	"operation created to every target's entry written (join)":           "finishes at N = 200 (bounded: 10 min)",
	"status writes refused by conflict per agent (join)":                 "a few, flat in N (jittered backoff)",
	"requests per agent during the join (apiserver counters, all kinds)": "(grows with the join's length: a lease List per 10 s)",
}

// rolloutSizes are the sizes measured and the metrics, in the order first recorded.
func (r *run) rolloutSizes() (sizes []int, metrics []string) {
	ns := map[int]bool{}
	for _, name := range r.order {
		m := rolloutName.FindStringSubmatch(name)
		if m == nil {
			continue
		}
		n, _ := strconv.Atoi(m[1])
		ns[n] = true
		if m[2] != rolloutNoise && !slices.Contains(metrics, m[2]) {
			metrics = append(metrics, m[2])
		}
	}
	for n := range ns {
		sizes = append(sizes, n)
	}
	slices.Sort(sizes)
	return sizes, metrics
}

// rolloutLines renders the rollout figures: label, the cells side by side, target.
func (r *run) rolloutLines() [][3]string {
	sizes, metrics := r.rolloutSizes()
	if len(sizes) == 0 {
		return [][3]string{{"rollout wait (N agents, one slot)", "n/a (not measured: " + r.why("BenchmarkRolloutWait") + ")", ""}}
	}
	var out [][3]string
	for _, metric := range metrics {
		var cells []string
		for _, n := range sizes {
			cells = append(cells, fmt.Sprintf("N=%d: %s", n, r.rolloutCell(n, metric)))
		}
		out = append(out, [3]string{"rollout wait: " + metric, strings.Join(cells, " | "), rolloutTargets[metric]})
	}
	lo, hi := sizes[0], sizes[len(sizes)-1]
	label := "rollout wait: requests per minute per waiting agent, largest N / smallest N"
	a, _, _, ok1 := r.value(fmt.Sprintf("rollout wait N=%d: %s", hi, rolloutReq))
	b, _, _, ok2 := r.value(fmt.Sprintf("rollout wait N=%d: %s", lo, rolloutReq))
	cell := "n/a (one size measured; " + r.why("BenchmarkRolloutWait") + ")"
	if lo != hi && ok1 && ok2 && b > 0 {
		cell = fmt.Sprintf("N=%d / N=%d: %s", hi, lo, format(a/b, "ratio"))
	}
	return append(out, [3]string{label, cell, "~ 1 (does not grow with N)"})
}

// rolloutCell is one size's value of metric; the CPU per waiting agent says when it is within the idle fleet's noise.
func (r *run) rolloutCell(n int, metric string) string {
	return r.sizedCell("rollout wait", n, metric, rolloutCPU, rolloutNoise, "the idle fleet's")
}
