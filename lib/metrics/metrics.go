// Package metrics is the watcher's Prometheus metrics: the collectors, fed
// by lib/watcher from what it publishes and from the status files the
// workers write, and the bounded HTTP listener that serves them (serve.go).
// Owned by the watcher: imported by lib/watcher and by the tests; no other
// stage runs long enough to be scraped.
//
// Everything lives on a private registry (never the library's global one),
// so nothing a dependency registers leaks into the endpoint. The Go and
// process collectors are left out: the watcher's memory and CPU are its
// unit's cgroup's, which node monitoring already exports, and they would
// cost a /proc read and runtime/metrics samples per scrape for figures
// nobody alerts on here.
//
// Every method is safe on a nil *Watcher, which records nothing: the
// in-process fleets of the benchmarks run the watcher loop without metrics.
package metrics

import (
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubeslot/kubeslot/lib/requests"
)

// Metric names (DESIGN.md, "Watcher metrics", says what each means).
const (
	NameOperations    = "kubeslot_operations_total"
	NamePhaseDuration = "kubeslot_operation_phase_duration_seconds"
	NameLastSuccess   = "kubeslot_operation_last_success_timestamp_seconds"
	NameDowntime      = "kubeslot_node_downtime_seconds"
	NameBuildInfo     = "kubeslot_build_info"
	NameLockWait      = "kubeslot_watcher_lock_wait_seconds_total"
	NameLockWaiting   = "kubeslot_watcher_lock_waiting"
	NameAPIErrors     = "kubeslot_api_errors_total"
)

// Results of an operation, the result label of NameOperations.
const (
	ResultSucceeded = "succeeded"
	ResultFailed    = "failed"
)

// phaseBuckets span a phase's range: milliseconds (commit) to the half
// hour a worker's unit allows (a slow download, a long drain).
var phaseBuckets = []float64{0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800}

// Watcher holds the watcher's collectors on a private registry.
type Watcher struct {
	reg         *prometheus.Registry
	ops         *prometheus.CounterVec
	phases      *prometheus.HistogramVec
	lastSuccess *prometheus.GaugeVec
	downtime    *prometheus.GaugeVec
	lockWait    prometheus.Counter
	lockWaiting prometheus.Gauge
	apiErrors   *prometheus.CounterVec

	mu sync.Mutex
	// last is the newest finished status seen per kind, so a status read
	// again (every decision lists status/) changes nothing, and an older
	// one (pruned newer ones, a clock step) never moves a gauge back.
	last map[requests.Kind]time.Time
	// succeeded is the newest success per kind, for the same reason.
	succeeded map[requests.Kind]time.Time
}

// New returns a Watcher whose build info says version (lib/buildinfo).
func New(version string) *Watcher {
	w := &Watcher{
		reg: prometheus.NewRegistry(),
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Name: NameOperations,
			Help: "Operations (requests) this watcher published as finished, by kind and result; resets when the watcher restarts."},
			[]string{"kind", "result"}),
		phases: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: NamePhaseDuration,
			Help:    "Durations of the phases of finished operations, as their workers recorded them in the status files.",
			Buckets: phaseBuckets}, []string{"kind", "phase"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: NameLastSuccess,
			Help: "When the newest successful operation of each kind finished (Unix time), read from the status files."},
			[]string{"kind"}),
		downtime: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: NameDowntime,
			Help: "Node downtime the worker measured in the newest finished repave or restart, read from the status files."},
			[]string{"kind"}),
		lockWait: prometheus.NewCounter(prometheus.CounterOpts{Name: NameLockWait,
			Help: "Time this watcher process waited for the installation lock at its start."}),
		lockWaiting: prometheus.NewGauge(prometheus.GaugeOpts{Name: NameLockWaiting,
			Help: "1 while the watcher waits for the installation lock (another stage holds it), else 0."}),
		apiErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: NameAPIErrors,
			Help: "Kubernetes API requests of this watcher that failed: an HTTP status of 400 or more, or code=\"transport\" when no answer came."},
			[]string{"verb", "resource", "code"}),
		last:      map[requests.Kind]time.Time{},
		succeeded: map[requests.Kind]time.Time{},
	}
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: NameBuildInfo,
		Help: "Always 1: the agent release this watcher runs, in its labels."}, []string{"version", "revision", "goversion"})
	build.WithLabelValues(version, revision(), runtime.Version()).Set(1)
	w.reg.MustRegister(w.ops, w.phases, w.lastSuccess, w.downtime, w.lockWait, w.lockWaiting, w.apiErrors, build)
	// Zero series for every kind and result, so that a rate or an alert on
	// failures has a series before the first one.
	for _, k := range requests.Kinds() {
		for _, r := range []string{ResultSucceeded, ResultFailed} {
			w.ops.WithLabelValues(string(k), r)
		}
	}
	return w
}

// Registry is what the endpoint serves (and the tests gather).
func (w *Watcher) Registry() *prometheus.Registry { return w.reg }

// revision is the VCS revision the Go toolchain stamped, "" without one
// (the Makefile builds with -buildvcs=false: the version from git describe
// names the commit then).
func revision() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			return s.Value
		}
	}
	return ""
}

// Published records a status the watcher has just published: a finished
// one counts as an operation of its kind and result, and its phases'
// durations (as the worker recorded them) go into the histogram. The
// watcher publishes each transition once (state/published.json), so each
// finished request is counted once across restarts of the watcher.
func (w *Watcher) Published(s *requests.Status) {
	if w == nil || s == nil || !s.Phase.Finished() || !s.Kind.Valid() {
		return
	}
	result := ResultSucceeded
	if s.Phase == requests.Failed {
		result = ResultFailed
	}
	w.ops.WithLabelValues(string(s.Kind), result).Inc()
	for _, p := range s.Phases {
		if p.Name == "" || p.Duration < 0 {
			continue
		}
		w.phases.WithLabelValues(string(s.Kind), p.Name).Observe(p.Duration.Seconds())
	}
	w.Statuses([]*requests.Status{s})
}

// Statuses sets the gauges that live in the status files from the
// statuses on disk: the newest success per kind and the downtime of the
// newest finished repave and restart. The watcher calls it with every
// listing of status/, so the values are back right after a restart (as long
// as the files are: requests.Prune keeps the newest of each kind).
func (w *Watcher) Statuses(st []*requests.Status) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range st {
		if s == nil || !s.Phase.Finished() || !s.Kind.Valid() || s.UpdatedAt.IsZero() {
			continue
		}
		k := string(s.Kind)
		if s.Phase == requests.Succeeded && s.UpdatedAt.After(w.succeeded[s.Kind]) {
			w.succeeded[s.Kind] = s.UpdatedAt
			w.lastSuccess.WithLabelValues(k).Set(float64(s.UpdatedAt.UnixNano()) / 1e9)
		}
		if !s.UpdatedAt.After(w.last[s.Kind]) {
			continue
		}
		w.last[s.Kind] = s.UpdatedAt
		if s.Kind == requests.Repave || s.Kind == requests.Restart {
			// A failed restart whose node never stopped, or a repave that
			// failed before its switch, measured none: 0 is the truth.
			w.downtime.WithLabelValues(k).Set(s.Downtime.Seconds())
		}
	}
}

// LockWaiting says whether the watcher is waiting for the installation
// lock now.
func (w *Watcher) LockWaiting(waiting bool) {
	if w == nil {
		return
	}
	v := 0.0
	if waiting {
		v = 1
	}
	w.lockWaiting.Set(v)
}

// AddLockWait adds d to the time waited for the installation lock.
func (w *Watcher) AddLockWait(d time.Duration) {
	if w == nil || d <= 0 {
		return
	}
	w.lockWait.Add(d.Seconds())
}
