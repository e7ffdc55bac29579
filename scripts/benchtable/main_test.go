package main

import (
	"strings"
	"testing"
)

const figuresIn = `{"name":"fleet N=200: apiserver memory growth per agent","value":61.5,"unit":"KiB","at":"2026-12-02T17:00:00Z","pid":1}
{"name":"fleet N=1: apiserver CPU per agent","value":-3,"unit":"CPU ms/min"}
{"name":"fleet N=1: apiserver CPU per agent, noise of the baseline","value":40,"unit":"CPU ms/min"}
{"name":"fleet N=200: apiserver CPU per agent","value":2.5,"unit":"CPU ms/min"}
{"name":"fleet N=200: apiserver CPU per agent, noise of the baseline","value":0.2,"unit":"CPU ms/min"}
{"name":"fleet N=1000: apiserver memory growth per agent","value":60,"unit":"KiB"}
{"name":"repave: cp -a of the same rootfs","value":4,"unit":"s"}
{"name":"watcher: spec update -> request file, p99 of 50","value":0.2,"unit":"s"}
{"name":"reset: bootstrapped host to nothing (target < 15 s)","value":5,"unit":"s"}
{"name":"reset: bootstrapped host to nothing (target < 15 s)","value":9,"unit":"s"}
{"name":"reset: bootstrapped host to nothing (target < 15 s)","value":7,"unit":"s"}
`

const logIn = `=== RUN   TestRepaveOnRig
rig: repave: target slot prepared from the cache (prepare phase) 1.00s
rig: repave: cp -a of the same rootfs 99.00s
rig: leakcheck: machine unchanged
--- PASS: TestRepaveOnRig (120.00s)
=== RUN   TestResetOnRig
--- PASS: TestResetOnRig (60.00s)
=== RUN   TestWatcherOnRig
=== RUN   TestWatcherOnRig/SpecChangeGivesOneRepave
    --- FAIL: TestWatcherOnRig/SpecChangeGivesOneRepave (3.00s)
--- FAIL: TestWatcherOnRig (30.00s)
=== RUN   TestWatcherIdle
rig: watcher RSS 36864 kB
rig: watcher idle API requests in 15 s: 2
--- PASS: TestWatcherIdle (1.00s)
=== RUN   TestBootstrapOnRig
--- SKIP: TestBootstrapOnRig (0.00s)
`

func TestTable(t *testing.T) {
	r := newRun()
	if err := r.readFigures(strings.NewReader(figuresIn), "in"); err != nil {
		t.Fatal(err)
	}
	if err := r.readLog(strings.NewReader(logIn)); err != nil {
		t.Fatal(err)
	}
	out := r.table()
	// Compare with runs of spaces collapsed: column widths follow the longest cell.
	var norm []string
	for _, l := range strings.Split(out, "\n") {
		norm = append(norm, strings.Join(strings.Fields(l), " "))
	}
	flat := strings.Join(norm, "\n")
	for _, want := range []string{
		"target slot preparation, ours (prepare phase) 1.00 s",
		// the figures file wins over the log for the same name
		"target slot preparation, plain copy (cp -a) 4.00 s",
		"target slot preparation, ours / plain copy 0.250",
		"7.00 s (median of 3)",
		"watcher reaction latency p50 (spec change -> request file) n/a (not measured: TestWatcherIdle passed without reporting it; TestWatcherOnRig failed before reporting it)",
		"watcher reaction latency p99 (spec change -> request file) 200 ms",
		"watcher RSS (real binary under systemd, TestWatcherOnRig) 36.0 MiB",
		"watcher idle Machine/operation requests (kubeconfig identity; apiserver counters, TestWatcherOnRig) 8.00 requests/min",
		"n/a (not measured: TestBootstrapOnRig skipped)",
		"n/a (not measured: no test matching TestUpgrade.* ran",
		"n/a (not measured: no test matching BenchmarkWatcherIdle ran",
		// one line per metric, the sizes side by side, smallest first; a size without the metric says so
		"fleet: apiserver memory growth per agent N=1: n/a | N=200: 61.5 KiB | N=1000: 60.0 KiB flat in N",
		"fleet: apiserver CPU per agent N=1: below the baseline's noise (-3.0 CPU ms/min, noise ±40.0 CPU ms/min) | " +
			"N=200: 2.5 CPU ms/min (noise ±0.2 CPU ms/min) | N=1000: n/a flat in N",
	} {
		if !strings.Contains(flat, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "noise of the baseline") {
		t.Errorf("the noise figure has a line of its own:\n%s", out)
	}
	if strings.Contains(out, "leakcheck") {
		t.Errorf("a rig: line that is no duration became a figure:\n%s", out)
	}
}

func TestReadFiguresRejectsDamage(t *testing.T) {
	for _, in := range []string{"{not json\n", `{"name":"x","value":1}` + "\n"} {
		if err := newRun().readFigures(strings.NewReader(in), "in"); err == nil {
			t.Errorf("%q: no error", in)
		}
	}
}

// The layered slot rows: sub-millisecond figures keep their digits, the ratios against cp -a and across sizes.
func TestSlotPrepareRows(t *testing.T) {
	r := newRun()
	in := `{"name":"` + slotPrep1 + `","value":0.0004,"unit":"s"}
{"name":"` + slotCopy1 + `","value":2.4,"unit":"s"}
{"name":"` + slotPrep2 + `","value":0.0005,"unit":"s"}
{"name":"` + slotCopy2 + `","value":4.8,"unit":"s"}
`
	if err := r.readFigures(strings.NewReader(in), "in"); err != nil {
		t.Fatal(err)
	}
	var norm []string
	for _, l := range strings.Split(r.table(), "\n") {
		norm = append(norm, strings.Join(strings.Fields(l), " "))
	}
	flat := strings.Join(norm, "\n")
	for _, want := range []string{
		"slot preparation, layered (Provision, cached tree; rootfs 1x) 0.40 ms <= 50 ms",
		"slot preparation, cp -a of the same tree (1x) 2.40 s (reference)",
		"slot preparation, cp -a / layered (1x) 6000.000 >= 10",
		"slot preparation, cp -a / layered (2x) 9600.000 >= 10",
		"slot preparation, layered 2x / 1x (flat when the rootfs doubles) 1.250 ~ 1",
		"whole Provision, layered (1x; the cached kubelet re-verified by sha256) n/a (not measured",
	} {
		if !strings.Contains(flat, want) {
			t.Errorf("table lacks %q:\n%s", want, flat)
		}
	}
}

// The rollout wait rows: sizes side by side, the CPU against the idle fleet's noise, the ratio across sizes.
func TestRolloutRows(t *testing.T) {
	r := newRun()
	in := `{"name":"rollout wait N=20: ` + rolloutReq + `","value":6.2,"unit":"requests/min"}
{"name":"rollout wait N=200: ` + rolloutReq + `","value":6.1,"unit":"requests/min"}
{"name":"rollout wait N=20: ` + rolloutCPU + `","value":1,"unit":"CPU ms/min"}
{"name":"rollout wait N=20: ` + rolloutNoise + `","value":3,"unit":"CPU ms/min"}
{"name":"rollout wait N=200: ` + rolloutCPU + `","value":2,"unit":"CPU ms/min"}
{"name":"rollout wait N=200: ` + rolloutNoise + `","value":0.5,"unit":"CPU ms/min"}
`
	if err := r.readFigures(strings.NewReader(in), "in"); err != nil {
		t.Fatal(err)
	}
	var norm []string
	for _, l := range strings.Split(r.table(), "\n") {
		norm = append(norm, strings.Join(strings.Fields(l), " "))
	}
	flat := strings.Join(norm, "\n")
	for _, want := range []string{
		"rollout wait: " + rolloutReq + " N=20: 6.20 requests/min | N=200: 6.10 requests/min flat in N",
		"rollout wait: " + rolloutCPU + " N=20: below the idle fleet's noise (1.0 CPU ms/min, noise ±3.0 CPU ms/min) | " +
			"N=200: 2.0 CPU ms/min (noise ±0.5 CPU ms/min) flat in N",
		"rollout wait: requests per minute per waiting agent, largest N / smallest N N=200 / N=20: 0.984 ~ 1",
	} {
		if !strings.Contains(flat, want) {
			t.Errorf("table lacks %q:\n%s", want, flat)
		}
	}
	if strings.Contains(flat, "noise of the idle fleet N=") {
		t.Errorf("the noise figure has a line of its own:\n%s", flat)
	}
	if empty := newRun().table(); !strings.Contains(empty, "rollout wait (N agents, one slot)") {
		t.Errorf("an unmeasured rollout wait is not said:\n%s", empty)
	}
}
