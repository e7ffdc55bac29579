package metrics

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kubeslot/kubeslot/lib/requests"
)

// families gathers w's registry by name.
func families(t *testing.T, w *Watcher) map[string]*dto.MetricFamily {
	t.Helper()
	fs, err := w.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fs {
		out[f.GetName()] = f
	}
	return out
}

// sample finds the metric of family name whose labels include want; nil
// when there is none.
func sample(fs map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	f := fs[name]
	if f == nil {
		return nil
	}
next:
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		return m
	}
	return nil
}

func counter(t *testing.T, fs map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	t.Helper()
	m := sample(fs, name, labels)
	if m == nil {
		t.Fatalf("no %s%v", name, labels)
	}
	if m.Counter != nil {
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

func TestPublishedCountsFinishedOnce(t *testing.T) {
	w := New("v1.2.3")
	at := time.Date(2026, 12, 4, 6, 0, 0, 0, time.UTC)
	st := func(id string, k requests.Kind, p requests.Phase, at time.Time, down time.Duration) *requests.Status {
		return &requests.Status{RequestID: id, Kind: k, Phase: p, UpdatedAt: at, Downtime: down, Phases: []requests.PhaseTiming{
			{Name: "drain", StartedAt: at.Add(-time.Minute), Duration: 2 * time.Second},
			{Name: "restart-node", StartedAt: at.Add(-50 * time.Second), Duration: 40 * time.Second}}}
	}
	fs := families(t, w)
	if v := counter(t, fs, NameOperations, map[string]string{"kind": "restart", "result": "failed"}); v != 0 {
		t.Errorf("before any operation: %v, want a zero series", v)
	}
	w.Published(st("restart-1-op", requests.Restart, requests.InProgress, at, 0)) // not finished: nothing
	w.Published(st("restart-1-op", requests.Restart, requests.Succeeded, at, 3*time.Second))
	w.Published(st("restart-2-op", requests.Restart, requests.Failed, at.Add(time.Hour), 0))
	fs = families(t, w)
	if v := counter(t, fs, NameOperations, map[string]string{"kind": "restart", "result": "succeeded"}); v != 1 {
		t.Errorf("restarts succeeded: %v, want 1", v)
	}
	if v := counter(t, fs, NameOperations, map[string]string{"kind": "restart", "result": "failed"}); v != 1 {
		t.Errorf("restarts failed: %v, want 1", v)
	}
	h := sample(fs, NamePhaseDuration, map[string]string{"kind": "restart", "phase": "restart-node"}).GetHistogram()
	if h.GetSampleCount() != 2 || h.GetSampleSum() != 80 {
		t.Errorf("restart-node histogram: count %d sum %v, want 2 and 80", h.GetSampleCount(), h.GetSampleSum())
	}
	// The newest success stays the last success; the newest finished (a
	// failure that never stopped the node) sets the downtime.
	if v := counter(t, fs, NameLastSuccess, map[string]string{"kind": "restart"}); v != float64(at.Unix()) {
		t.Errorf("last success %v, want %d", v, at.Unix())
	}
	if v := counter(t, fs, NameDowntime, map[string]string{"kind": "restart"}); v != 0 {
		t.Errorf("downtime %v, want 0 (the newest restart failed before stopping the node)", v)
	}
}

func TestStatusesFromDiskNeverGoBack(t *testing.T) {
	w := New("devel")
	at := time.Date(2026, 12, 4, 6, 0, 0, 0, time.UTC)
	newer := &requests.Status{RequestID: "repave-3-spec", Kind: requests.Repave, Phase: requests.Succeeded, UpdatedAt: at, Downtime: 7 * time.Second}
	older := &requests.Status{RequestID: "repave-2-spec", Kind: requests.Repave, Phase: requests.Succeeded, UpdatedAt: at.Add(-time.Hour), Downtime: 30 * time.Second}
	pending := &requests.Status{RequestID: "repave-4-spec", Kind: requests.Repave, Phase: requests.InProgress, UpdatedAt: at.Add(time.Hour)}
	w.Statuses([]*requests.Status{newer, older, pending})
	w.Statuses([]*requests.Status{older}) // the newer pruned, or listed in another order
	fs := families(t, w)
	if v := counter(t, fs, NameDowntime, map[string]string{"kind": "repave"}); v != 7 {
		t.Errorf("repave downtime %v, want 7 (the newest finished)", v)
	}
	if v := counter(t, fs, NameLastSuccess, map[string]string{"kind": "repave"}); v != float64(at.Unix()) {
		t.Errorf("last repave success %v, want %d", v, at.Unix())
	}
	if sample(fs, NameDowntime, map[string]string{"kind": "upgrade"}) != nil {
		t.Error("an upgrade has no node downtime, but the gauge has a series for it")
	}
	// Statuses never counts: only what the watcher publishes does.
	if v := counter(t, fs, NameOperations, map[string]string{"kind": "repave", "result": "succeeded"}); v != 0 {
		t.Errorf("operations counted from a listing: %v", v)
	}
}

func TestBuildInfoAndLock(t *testing.T) {
	w := New("v9.9.9-3-gabcdef")
	w.LockWaiting(true)
	w.AddLockWait(1500 * time.Millisecond)
	fs := families(t, w)
	if v := counter(t, fs, NameBuildInfo, map[string]string{"version": "v9.9.9-3-gabcdef"}); v != 1 {
		t.Errorf("build info %v, want 1", v)
	}
	if v := counter(t, fs, NameLockWaiting, nil); v != 1 {
		t.Errorf("lock waiting %v, want 1", v)
	}
	w.LockWaiting(false)
	w.AddLockWait(500 * time.Millisecond)
	fs = families(t, w)
	if v := counter(t, fs, NameLockWait, nil); v != 2 {
		t.Errorf("lock wait %v s, want 2", v)
	}
	if v := counter(t, fs, NameLockWaiting, nil); v != 0 {
		t.Errorf("lock waiting %v, want 0", v)
	}
}

func TestNilWatcherRecordsNothing(t *testing.T) {
	var w *Watcher
	w.Published(&requests.Status{Kind: requests.Repave, Phase: requests.Succeeded})
	w.Statuses(nil)
	w.LockWaiting(true)
	w.AddLockWait(time.Second)
	rt := roundTrip(func(*http.Request) (*http.Response, error) { return nil, nil })
	if got := w.WrapTransport(rt); got == nil {
		t.Error("a nil Watcher must hand the transport back unchanged")
	}
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestAPIErrorsAtTheTransport(t *testing.T) {
	w := New("devel")
	answer := map[string]int{"/apis/kubeslot.dev/v1alpha1/machines/n1/status": 409,
		"/api/v1/namespaces/default/events": 403, "/api/v1/nodes": 200}
	rt := w.WrapTransport(roundTrip(func(r *http.Request) (*http.Response, error) {
		if r.URL.Path == "/down" || strings.Contains(r.URL.Path, "machineoperations") {
			return nil, errors.New("connection refused")
		}
		return &http.Response{StatusCode: answer[r.URL.Path], Body: http.NoBody}, nil
	}))
	do := func(ctx context.Context, method, url string) {
		req, _ := http.NewRequestWithContext(ctx, method, "https://api.test"+url, nil)
		if resp, err := rt.RoundTrip(req); err == nil {
			resp.Body.Close()
		}
	}
	ctx := t.Context()
	do(ctx, http.MethodPut, "/apis/kubeslot.dev/v1alpha1/machines/n1/status")
	do(ctx, http.MethodPut, "/apis/kubeslot.dev/v1alpha1/machines/n1/status")
	do(ctx, http.MethodPost, "/api/v1/namespaces/default/events")
	do(ctx, http.MethodGet, "/api/v1/nodes?fieldSelector=x") // 200: not an error
	do(ctx, http.MethodGet, "/apis/kubeslot.dev/v1alpha1/machineoperations?watch=true")
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	do(cancelled, http.MethodGet, "/apis/kubeslot.dev/v1alpha1/machineoperations?watch=true") // ours: not counted
	fs := families(t, w)
	for _, c := range []struct {
		labels map[string]string
		want   float64
	}{
		{map[string]string{"verb": "put", "resource": "machines/status", "code": "409"}, 2},
		{map[string]string{"verb": "post", "resource": "events", "code": "403"}, 1},
		{map[string]string{"verb": "watch", "resource": "machineoperations", "code": "transport"}, 1},
	} {
		if v := counter(t, fs, NameAPIErrors, c.labels); v != c.want {
			t.Errorf("%v: %v, want %v", c.labels, v, c.want)
		}
	}
	if n := len(fs[NameAPIErrors].GetMetric()); n != 3 {
		t.Errorf("%d series of %s, want 3 (a success is no error)", n, NameAPIErrors)
	}
}

func TestResourceOf(t *testing.T) {
	for path, want := range map[string]string{
		"/api/v1/nodes":                                      "nodes",
		"/api/v1/nodes/worker-1":                             "nodes",
		"/api/v1/namespaces/default/events":                  "events",
		"/apis/kubeslot.dev/v1alpha1/machines/m/status":      "machines/status",
		"/apis/kubeslot.dev/v1alpha1/machineoperations":      "machineoperations",
		"/apis/coordination.k8s.io/v1/namespaces/x/leases/y": "leases",
		"/version":  "other",
		"/api":      "other",
		"/api/v1/X": "other",
	} {
		if got := resourceOf(path); got != want {
			t.Errorf("resourceOf(%q) = %q, want %q", path, got, want)
		}
	}
}

// TestEndpoint serves a registry on a loopback port, scrapes it and parses
// the exposition format; a second endpoint on the same port is a clear
// error naming the address.
func TestEndpoint(t *testing.T) {
	w := New("v0.0.1")
	w.Published(&requests.Status{RequestID: "repave-1-spec", Kind: requests.Repave, Phase: requests.Succeeded,
		UpdatedAt: time.Now(), Downtime: 4 * time.Second})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := Listen("127.0.0.1:0", w, log)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get("http://" + srv.Addr() + Path)
	if err != nil {
		t.Fatal(err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fs, err := p.TextToMetricFamilies(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("parse the scrape: %v", err)
	}
	if v := counter(t, fs, NameOperations, map[string]string{"kind": "repave", "result": "succeeded"}); v != 1 {
		t.Errorf("scraped repaves succeeded: %v, want 1", v)
	}
	if v := counter(t, fs, NameDowntime, map[string]string{"kind": "repave"}); v != 4 {
		t.Errorf("scraped downtime: %v, want 4", v)
	}
	if _, err := Listen(srv.Addr(), w, log); err == nil || !strings.Contains(err.Error(), srv.Addr()) {
		t.Errorf("a second endpoint on %s: %v, want an error naming the address", srv.Addr(), err)
	}
	srv.Close()
	if c, err := net.DialTimeout("tcp", srv.Addr(), time.Second); err == nil {
		c.Close()
		t.Errorf("%s still accepts connections after Close", srv.Addr())
	}
}
