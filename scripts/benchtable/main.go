// Command benchtable prints the one table of `make bench`: kubeslot's measured figures next to the
// stage targets, from the figures the rig tests and benchmarks under integration/ recorded in one run.
// Used by scripts/bench.sh only.
//
// Inputs: -figures, the JSON lines integration's figure table appends to KUBESLOT_FIGURES_FILE ({"name", "value",
// "unit"}), and -log, the `go test -v` output of the same run, for two things: the "rig: <name> <seconds>s" lines of
// durations the tests print without adding them to the figure table, and each test's result, to say why a figure is
// missing. A figure missing from both is printed as "n/a (not measured: <why>)". Figures are printed, never judged:
// the target column is for the reader.
//
// It is a Go program rather than part of the shell script because it parses JSON, takes medians and derives a ratio;
// the machine need not have jq, and the parsing is tested (main_test.go).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// sample is one measured value.
type sample struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
}

// run is what one go test run measured and how its tests ended.
type run struct {
	order   []string            // figure names, first appearance first
	samples map[string][]sample // by name
	results map[string]string   // top-level test or benchmark -> PASS, FAIL, SKIP, RUN (started, no result)
}

func newRun() *run { return &run{samples: map[string][]sample{}, results: map[string]string{}} }

func (r *run) add(s sample) {
	if _, ok := r.samples[s.Name]; !ok {
		r.order = append(r.order, s.Name)
	}
	r.samples[s.Name] = append(r.samples[s.Name], s)
}

// readFigures reads the JSON lines of KUBESLOT_FIGURES_FILE.
func (r *run) readFigures(in io.Reader, src string) error {
	sc := bufio.NewScanner(in)
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimSpace(sc.Text())
		if l == "" {
			continue
		}
		var s sample
		if err := json.Unmarshal([]byte(l), &s); err != nil {
			return fmt.Errorf("%s:%d: %w", src, n, err)
		}
		if s.Name == "" || s.Unit == "" {
			return fmt.Errorf("%s:%d: figure without a name or unit: %s", src, n, l)
		}
		r.add(s)
	}
	return sc.Err()
}

var (
	rigLine    = regexp.MustCompile(`^rig: (.+) (-?[0-9]+(?:\.[0-9]+)?)s$`)
	rigRSS     = regexp.MustCompile(`^rig: watcher RSS ([0-9]+) kB$`)
	rigIdle    = regexp.MustCompile(`^rig: watcher idle API requests in ([0-9]+) s: ([0-9]+)$`)
	resultLine = regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP|BENCH): ((?:Test|Benchmark)[^\s/]*)[\s/]`)
	runLine    = regexp.MustCompile(`^=== RUN\s+((?:Test|Benchmark)[^\s/]*)\s*$`)
	benchLine  = regexp.MustCompile(`^(Benchmark[^\s/-]+)`)
)

// readLog takes from go test -v output the "rig:" durations whose names the figures file lacks, and the results of
// the top-level tests and benchmarks.
func (r *run) readLog(in io.Reader) error {
	fromFile := map[string]bool{}
	for n := range r.samples {
		fromFile[n] = true
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		l := sc.Text()
		if m := rigLine.FindStringSubmatch(l); m != nil && !fromFile[m[1]] {
			v, err := strconv.ParseFloat(m[2], 64)
			if err == nil {
				r.add(sample{Name: m[1], Value: v, Unit: "s"})
			}
			continue
		}
		// Two figures TestWatcherOnRig prints in its own words.
		if m := rigRSS.FindStringSubmatch(l); m != nil && !fromFile[rssName] {
			kb, _ := strconv.ParseFloat(m[1], 64)
			r.add(sample{Name: rssName, Value: kb / 1024, Unit: "MiB"})
			continue
		}
		if m := rigIdle.FindStringSubmatch(l); m != nil && !fromFile[idleName] {
			secs, _ := strconv.ParseFloat(m[1], 64)
			n, _ := strconv.ParseFloat(m[2], 64)
			if secs > 0 {
				r.add(sample{Name: idleName, Value: n * 60 / secs, Unit: "requests/min"})
			}
			continue
		}
		if m := runLine.FindStringSubmatch(l); m != nil {
			if _, ok := r.results[m[1]]; !ok {
				r.results[m[1]] = "RUN"
			}
			continue
		}
		if m := resultLine.FindStringSubmatch(l + " "); m != nil {
			res := m[1]
			if res == "BENCH" {
				res = "PASS"
			}
			if r.results[m[2]] != "FAIL" { // a subtest's failure marks the whole test
				r.results[m[2]] = res
			}
			continue
		}
		if m := benchLine.FindStringSubmatch(l); m != nil {
			if _, ok := r.results[m[1]]; !ok {
				r.results[m[1]] = "PASS" // a result line without -v's RUN line
			}
		}
	}
	return sc.Err()
}

// value is the median of name's samples, with their unit and count. A name ending in "*" stands for the first
// figure name with that prefix (helpers put counts in names: "p99 of 50").
func (r *run) value(name string) (v float64, unit string, n int, ok bool) {
	if p, found := strings.CutSuffix(name, "*"); found {
		name = ""
		for _, o := range r.order {
			if strings.HasPrefix(o, p) {
				name = o
				break
			}
		}
	}
	ss := r.samples[name]
	if len(ss) == 0 {
		return 0, "", 0, false
	}
	vs := make([]float64, len(ss))
	for i, s := range ss {
		vs[i] = s.Value
	}
	slices.Sort(vs)
	m := vs[len(vs)/2]
	if len(vs)%2 == 0 {
		m = (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
	}
	return m, ss[0].Unit, len(ss), true
}

// why says why no figure came from the tests matching pattern.
func (r *run) why(pattern string) string {
	re := regexp.MustCompile(`^(?:` + pattern + `)$`)
	var names []string
	for n := range r.results {
		if re.MatchString(n) {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	if len(names) == 0 {
		return fmt.Sprintf("no test matching %s ran: absent from this tree or not selected", pattern)
	}
	var parts []string
	for _, n := range names {
		switch r.results[n] {
		case "FAIL":
			parts = append(parts, n+" failed before reporting it")
		case "SKIP":
			parts = append(parts, n+" skipped")
		case "RUN":
			parts = append(parts, n+" did not finish")
		default:
			parts = append(parts, n+" passed without reporting it")
		}
	}
	return strings.Join(parts, "; ")
}

// row is one line of the table.
type row struct {
	label, target string
	names         []string // figure names, the first one measured wins
	tests         string   // regexp of the tests that measure it
	derive        func(r *run) (float64, string, bool)
}

func format(v float64, unit string) string {
	switch unit {
	case "s":
		if v < 0.01 { // sub-millisecond figures (an overlay slot's preparation) keep their digits
			return fmt.Sprintf("%.2f ms", v*1000)
		}
		if v < 1 {
			return fmt.Sprintf("%.0f ms", v*1000)
		}
		return fmt.Sprintf("%.2f s", v)
	case "ratio":
		return fmt.Sprintf("%.3f", v)
	case "KiB", "MiB", "CPU %", "CPU ms/min":
		return fmt.Sprintf("%.1f %s", v, unit)
	default:
		return fmt.Sprintf("%.2f %s", v, unit)
	}
}

func (r *run) cell(w row) string {
	if w.derive != nil {
		if v, unit, ok := w.derive(r); ok {
			return format(v, unit)
		}
		return "n/a (not measured: " + r.why(w.tests) + ")"
	}
	for _, n := range w.names {
		if v, unit, k, ok := r.value(n); ok {
			s := format(v, unit)
			if k > 1 {
				s += fmt.Sprintf(" (median of %d)", k)
			}
			return s
		}
	}
	return "n/a (not measured: " + r.why(w.tests) + ")"
}

const (
	prepOurs = "repave: target slot prepared from the cache (prepare phase)"
	prepCopy = "repave: cp -a of the same rootfs"
	// TestOverlaySlotsOnRig: the real Provision of a layered slot from the cached tree, at two rootfs sizes.
	slotPrep1 = "slot prepare 1x: Provision from the cached tree and artifacts (after their verification)"
	slotPrep2 = "slot prepare 2x: Provision from the cached tree and artifacts (after their verification)"
	slotCopy1 = "slot prepare 1x: cp -a of the same tree"
	slotCopy2 = "slot prepare 2x: cp -a of the same tree"
	slotProv1 = "slot prepare 1x: whole Provision (cached artifacts re-verified)"
	rssName   = "watcher (rig host, under systemd): RSS"
	idleName  = "watcher (rig host, under systemd): idle API requests"
	// TestWatcherIdleOnRig: the watcher as production hosts run it, counted per client at the apiserver.
	idleUnit        = "watcher (rig host, its unit, node identity): idle requests besides watches (apiserver audit)"
	idleUnitWatches = "watcher (rig host, its unit, node identity): watches opened when idle (apiserver audit)"
	idleRSS         = "watcher (rig host, its unit, node identity): RSS when idle"
	// TestUpgradeOnRig (integration/repave/upgrade_test.go), Good subtest and each good upgrade after it.
	upgradeVerdict = "upgrade: operation created to Succeeded (verdict; probation follows)"
)

var rows = []row{
	{label: "bootstrap to Node Ready (first-boot unit, artifacts cached)", target: "< 30 s", tests: "TestBootstrapOnRig",
		names: []string{"bootstrap: first-boot unit to complete (artifacts cached; Node Ready included)"}},
	{label: "bootstrap re-run on a complete host", target: "< 1 s", tests: "TestBootstrapOnRig",
		names: []string{"bootstrap: complete re-run (incl. nsenter)"}},
	{label: "repave node downtime (old kubelet stopped -> Node Ready; warm standby)", target: "<= 0.7 s", tests: "TestRepaveOnRig",
		names: []string{"repave a->b: node downtime (old kubelet stopped -> Node Ready)"}},
	{label: "restart in place node downtime (old kubelet stopped -> Node Ready)", target: "<= 0.7 s", tests: "TestRepaveOnRig",
		names: []string{"restart in place: node downtime (old kubelet stopped -> Node Ready)"}},
	// A warm standby's downtime is at least a kubelet stop plus a kubelet start: this is that alone, in the
	// serving node with everything else running, so no ordering of the slots can go below it.
	{label: "floor: kubelet stop + start in the serving node (containerd, machine untouched) -> Node Ready", target: "(reference)", tests: "TestRepaveOnRig",
		names: []string{"floor: kubelet stop + start in the serving node (containerd, machine untouched) -> Node Ready"}},
	{label: "target slot preparation, ours (prepare phase)", target: "< 2 s", tests: "TestRepaveOnRig", names: []string{prepOurs}},
	{label: "target slot preparation, plain copy (cp -a)", target: "(reference)", tests: "TestRepaveOnRig", names: []string{prepCopy}},
	{label: "target slot preparation, ours / plain copy", target: "< 1", tests: "TestRepaveOnRig",
		derive: func(r *run) (float64, string, bool) {
			a, _, _, ok1 := r.value(prepOurs)
			b, _, _, ok2 := r.value(prepCopy)
			return a / b, "ratio", ok1 && ok2 && b > 0
		}},
	{label: "slot preparation, layered (Provision, cached tree; rootfs 1x)", target: "<= 50 ms", tests: "TestOverlaySlotsOnRig", names: []string{slotPrep1}},
	{label: "slot preparation, cp -a of the same tree (1x)", target: "(reference)", tests: "TestOverlaySlotsOnRig", names: []string{slotCopy1}},
	{label: "slot preparation, cp -a / layered (1x)", target: ">= 10", tests: "TestOverlaySlotsOnRig", derive: ratioOf(slotCopy1, slotPrep1)},
	{label: "slot preparation, layered (rootfs 2x)", target: "<= 50 ms", tests: "TestOverlaySlotsOnRig", names: []string{slotPrep2}},
	{label: "slot preparation, cp -a of the same tree (2x)", target: "(reference)", tests: "TestOverlaySlotsOnRig", names: []string{slotCopy2}},
	{label: "slot preparation, cp -a / layered (2x)", target: ">= 10", tests: "TestOverlaySlotsOnRig", derive: ratioOf(slotCopy2, slotPrep2)},
	{label: "slot preparation, layered 2x / 1x (flat when the rootfs doubles)", target: "~ 1", tests: "TestOverlaySlotsOnRig", derive: ratioOf(slotPrep2, slotPrep1)},
	{label: "whole Provision, layered (1x; the cached kubelet re-verified by sha256)", target: "", tests: "TestOverlaySlotsOnRig", names: []string{slotProv1}},
	{label: "whole repave (request dropped -> Succeeded)", target: "< 30 s", tests: "TestRepaveOnRig",
		names: []string{"repave a->b: request dropped -> status Succeeded (path unit included)"}},
	// The verdict does not wait out a settle time: the release stays on probation after it instead.
	{label: "agent upgrade verdict (operation created -> Succeeded; real units and binaries, node identity)",
		target: "<= 10 s", tests: "TestUpgrade.*", names: []string{upgradeVerdict}},
	{label: "agent upgrade (bundle downloaded -> healthy new watcher)", target: "< 15 s", tests: "TestUpgrade.*",
		names: []string{"upgrade: bundle downloaded to healthy new watcher", "upgrade: downloaded to healthy new watcher"}},
	{label: "rollback by the upgrader (operation created -> Failed, old release running)", target: "< 60 s", tests: "TestUpgrade.*",
		names: []string{"upgrade: failed upgrade back on the old release", "upgrade: bad watcher, operation created to Failed"}},
	{label: "rollback by the recovery unit (kill -9 on probation, after Succeeded -> rollback published, old watcher back)", target: "< 60 s", tests: "TestUpgrade.*",
		names: []string{"upgrade: kill -9 on probation to rollback published, old watcher back (recovery unit)", "upgrade: late crash, upgrader done to old watcher back (recovery unit)"}},
	{label: "reset (bootstrapped host -> nothing)", target: "< 15 s", tests: "TestResetOnRig",
		names: []string{"reset: bootstrapped host to nothing (target < 15 s)"}},
	{label: "workload downtime across a repave (images warm, hostPort probe)", target: "<= 3 s", tests: "TestPodsOnRig",
		names: []string{"pods: workload downtime across a repave (hostPort probe from the host)"}},
	{label: "workload downtime across a restart in place (hostPort probe)", target: "", tests: "TestPodsOnRig",
		names: []string{"pods: workload downtime across a restart (hostPort probe from the host)"}},
	{label: "repave status written (after commit and clean) -> its pods Ready", target: "", tests: "TestPodsOnRig",
		names: []string{"pods: repave status written (after commit and clean) -> pods Ready"}},
	{label: "workload downtime across a Kubernetes patch release in place (1.37.1 -> 1.37.2 through the Machine)", target: "<= 0.2 s", tests: "TestKubernetesUpgradeOnRig",
		names: []string{"kubernetes upgrade in place: workload downtime (hostPort probe from the host)"}},
	{label: "workload downtime across a Kubernetes version change by repave (updateMethod Repave)", target: "< 10 s", tests: "TestKubernetesUpgradeOnRig",
		names: []string{"kubernetes upgrade by repave: workload downtime (hostPort probe from the host)"}},
	{label: "paced rollout of 3 rig hosts, maxUnavailable 1 (operation created -> Succeeded; real repaves, drain, lease 45 s, poll 1 s)",
		target: "", tests: "TestRolloutOnRig", names: []string{rolloutWhole}},
	{label: "the same 3 repaves, summed (each request's first phase -> final status)", target: "(reference)",
		tests: "TestRolloutOnRig", names: []string{rolloutSum}},
	{label: "rollout / sum of its repaves (the slot hand-overs' cost)", target: "~ 1", tests: "TestRolloutOnRig",
		derive: ratioOf(rolloutWhole, rolloutSum)},
	{label: "agent creates its Machine, no other Machine (admission, median)", target: "(reference)", tests: "BenchmarkAgentAdmission",
		names: []string{admCreate0}},
	{label: "agent creates its Machine, 1000 other Machines (admission, median)", target: "", tests: "BenchmarkAgentAdmission",
		names: []string{admCreate1000}},
	{label: "agent creates its Machine, 1000 / no other Machines (cost must not grow with N)", target: "~ 1", tests: "BenchmarkAgentAdmission",
		derive: ratioOf(admCreate1000, admCreate0)},
	{label: "agent writes its operation entry, 1000 / no other Machines (request-only checks)", target: "~ 1", tests: "BenchmarkAgentAdmission",
		derive: ratioOf(admStatus1000, admStatus0)},
	{label: "watcher reaction latency p50 (spec change -> request file)", target: "", tests: "TestWatcher.*",
		names: []string{"watcher: reaction latency p50", "watcher: spec update -> request file, p50 of *"}},
	{label: "watcher reaction latency p99 (spec change -> request file)", target: "< 0.5 s", tests: "TestWatcher.*",
		names: []string{"watcher: reaction latency p99", "watcher: spec update -> request file, p99 of *"}},
	{label: "watcher RSS idle (its unit, bootstrapped host, node identity; TestWatcherIdleOnRig)", target: "<= 15 MiB",
		tests: "TestWatcherIdleOnRig", names: []string{idleRSS}},
	{label: "watcher RSS (real binary, idle, BenchmarkWatcherIdle)", target: "<= 15 MiB", tests: "BenchmarkWatcherIdle",
		names: []string{"watcher (binary): RSS when idle"}},
	{label: "watcher RSS (real binary under systemd, TestWatcherOnRig)", target: "< 30 MB", tests: "TestWatcher.*",
		names: []string{rssName}},
	{label: "watcher idle requests besides watches (its unit, bootstrapped host, node identity; apiserver audit)", target: "0",
		tests: "TestWatcherIdleOnRig", names: []string{idleUnit}},
	{label: "watcher watches opened per idle minute (same; each watch lives its 5-10 min server-side timeout)", target: "<= 0.6",
		tests: "TestWatcherIdleOnRig", names: []string{idleUnitWatches}},
	{label: "watcher idle requests besides watches (real binary, node identity; apiserver audit)", target: "0",
		tests: "BenchmarkWatcherIdle", names: []string{"watcher (binary, node identity): idle requests besides watches (apiserver audit)"}},
	{label: "watcher idle requests besides watches (in-process, N=1, node identity; apiserver audit)", target: "0",
		tests: "BenchmarkFleet", names: []string{"fleet N=1: requests per agent besides watches (apiserver audit, node identity)"}},
	{label: "watcher idle Machine/operation requests (kubeconfig identity; apiserver counters, TestWatcherOnRig)", target: "0 besides watches",
		tests: "TestWatcher.*", names: []string{idleName}},
}

// TestRolloutOnRig's figures (integration/rollout/rollout_rig_test.go): one paced Repave of three real rig hosts, one at a
// time with drains, against the sum of the same three repaves as each host timed its own request.
const (
	rolloutWhole = "rollout of 3 rig hosts, maxUnavailable 1: operation created -> Succeeded (real repaves, drain)"
	rolloutSum   = "rollout of 3 rig hosts: sum of its 3 repaves (each request's first phase -> final status)"
)

// BenchmarkAgentAdmission's figures (integration/bench/bench_admission_test.go).
const (
	admCreate0    = "admission with 0 Machines: an agent creates its Machine (median)"
	admCreate1000 = "admission with 1000 Machines: an agent creates its Machine (median)"
	admStatus0    = "admission with 0 Machines: an agent writes its entry in a selector operation (median)"
	admStatus1000 = "admission with 1000 Machines: an agent writes its entry in a selector operation (median)"
)

// ratioOf derives the ratio of two figures.
func ratioOf(num, den string) func(r *run) (float64, string, bool) {
	return func(r *run) (float64, string, bool) {
		a, _, _, ok1 := r.value(num)
		b, _, _, ok2 := r.value(den)
		return a / b, "ratio", ok1 && ok2 && b > 0
	}
}

// table renders the run.
func (r *run) table() string {
	type line struct{ a, b, c string }
	lines := []line{{"figure", "measured", "target"}}
	for _, w := range rows {
		lines = append(lines, line{w.label, r.cell(w), w.target})
	}
	var fleet []line
	for _, l := range r.fleetLines() {
		fleet = append(fleet, line{l[0], l[1], l[2]})
	}
	if len(fleet) == 0 {
		fleet = []line{{"fleet (N watchers, one apiserver)", "n/a (not measured: " + r.why("BenchmarkFleet") + ")", ""}}
	}
	lines = append(lines, fleet...)
	for _, l := range r.rolloutLines() {
		lines = append(lines, line{l[0], l[1], l[2]})
	}
	wa, wb := 0, 0
	for _, l := range lines {
		wa, wb = max(wa, len(l.a)), max(wb, len(l.b))
	}
	var b strings.Builder
	for i, l := range lines {
		fmt.Fprintf(&b, "%-*s  %-*s  %s\n", wa, l.a, wb, l.b, l.c)
		if i == 0 || i == len(rows) {
			fmt.Fprintf(&b, "%s\n", strings.Repeat("-", wa+wb+4+len("target")))
		}
	}
	return b.String()
}

func main() {
	figures := flag.String("figures", "", "JSON lines of the figure table (KUBESLOT_FIGURES_FILE)")
	logPath := flag.String("log", "", "go test -v output of the same run")
	flag.Parse()
	r := newRun()
	if err := r.load(*figures, *logPath); err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
	fmt.Print(r.table())
}

// load reads both inputs; an absent figures file is an empty one (nothing measured).
func (r *run) load(figures, logPath string) error {
	if figures != "" {
		f, err := os.Open(figures)
		switch {
		case err == nil:
			defer f.Close()
			if err := r.readFigures(f, figures); err != nil {
				return err
			}
		case !os.IsNotExist(err):
			return err
		}
	}
	if logPath != "" {
		f, err := os.Open(logPath)
		if err != nil {
			return err
		}
		defer f.Close()
		return r.readLog(f)
	}
	return nil
}
