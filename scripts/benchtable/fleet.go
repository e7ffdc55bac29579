package main

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// The fleet benchmark records each figure once per fleet size, as "fleet N=<n>: <metric>". The table shows one
// line per metric with the sizes side by side, smallest first, so that a per-agent cost that grows with N shows.

var fleetName = regexp.MustCompile(`^fleet N=([0-9]+): (.+)$`)

// fleetNoise names the figure that holds, for a fleet size, how much the apiserver's idle CPU per minute moved
// between the two halves of its baseline window, divided by N: a per-agent CPU figure smaller than it cannot be told
// from the baseline.
const (
	fleetCPU   = "apiserver CPU per agent"
	fleetNoise = "apiserver CPU per agent, noise of the baseline"
)

// fleetTargets are the targets beside the per-agent metrics.
var fleetTargets = map[string]string{
	fleetCPU:                            "flat in N",
	"apiserver memory growth per agent": "flat in N",
	"requests per agent besides watches (apiserver audit, node identity)": "0",
	"start to all Machines registered and reported":                       "(time, all agents)",
}

// fleetLines renders the fleet figures: label, the cells side by side, target.
func (r *run) fleetLines() [][3]string {
	var metrics []string
	ns := map[int]bool{}
	for _, name := range r.order {
		m := fleetName.FindStringSubmatch(name)
		if m == nil {
			continue
		}
		n, _ := strconv.Atoi(m[1])
		ns[n] = true
		if m[2] != fleetNoise && !slices.Contains(metrics, m[2]) {
			metrics = append(metrics, m[2])
		}
	}
	sizes := make([]int, 0, len(ns))
	for n := range ns {
		sizes = append(sizes, n)
	}
	slices.Sort(sizes)
	var out [][3]string
	for _, metric := range metrics {
		var cells []string
		for _, n := range sizes {
			cells = append(cells, fmt.Sprintf("N=%d: %s", n, r.fleetCell(n, metric)))
		}
		out = append(out, [3]string{"fleet: " + metric, strings.Join(cells, " | "), fleetTargets[metric]})
	}
	return out
}

// fleetCell is one size's value of metric; the CPU per agent says when it is within the baseline's noise.
func (r *run) fleetCell(n int, metric string) string {
	return r.sizedCell("fleet", n, metric, fleetCPU, fleetNoise, "the baseline's")
}

// sizedCell is the value of "<prefix> N=<n>: <metric>"; when metric is cpu, it says whether the value is within the
// figure noise of the same size (whose is the noise's owner, as "the baseline's").
func (r *run) sizedCell(prefix string, n int, metric, cpu, noise, whose string) string {
	v, unit, k, ok := r.value(fmt.Sprintf("%s N=%d: %s", prefix, n, metric))
	if !ok {
		return "n/a"
	}
	s := format(v, unit)
	if metric == cpu {
		if bound, _, _, ok := r.value(fmt.Sprintf("%s N=%d: %s", prefix, n, noise)); ok {
			if math.Abs(v) <= bound {
				s = fmt.Sprintf("below %s noise (%s, noise ±%s)", whose, s, format(bound, unit))
			} else {
				s += " (noise ±" + format(bound, unit) + ")"
			}
		}
	}
	if k > 1 {
		s += fmt.Sprintf(" (median of %d)", k)
	}
	return s
}
