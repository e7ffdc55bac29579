package workload

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// An outage still going on when Downtime is called is measured whole: the
// caller may have seen its operation end (a pod status that reads Ready)
// before the workload answers again.
func TestDowntimeCalledDuringTheOutage(t *testing.T) {
	var down atomic.Bool
	pr := StartProbe(func(context.Context) bool { return !down.Load() })
	defer pr.Stop()
	since := time.Now()
	time.Sleep(400 * time.Millisecond)
	down.Store(true)
	outage := time.Now()
	time.Sleep(150 * time.Millisecond) // inside the outage, within a second of the last answer
	go func() {
		time.Sleep(time.Second)
		down.Store(false)
	}()
	gap, last, first, err := pr.Downtime(context.Background(), since, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if gap < time.Second || last.After(outage) || first.Before(outage.Add(time.Second)) {
		t.Errorf("gap %s from %s to %s; want the whole outage of 1.15 s from %s", gap,
			last.Format("05.000"), first.Format("05.000"), outage.Format("05.000"))
	}
}

// Without an outage the longest gap is the probe's own period.
func TestDowntimeWithoutAnOutage(t *testing.T) {
	pr := StartProbe(func(context.Context) bool { return true })
	defer pr.Stop()
	since := time.Now()
	time.Sleep(300 * time.Millisecond)
	called := time.Now()
	gap, _, _, err := pr.Downtime(context.Background(), since, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if gap >= time.Second {
		t.Errorf("gap %s without an outage", gap)
	}
	if time.Since(called) < time.Second {
		t.Errorf("returned %s after the call, before a second of answers past it", time.Since(called))
	}
}
