package nspawn

import (
	"testing"
	"time"
)

// TestStartedFromShow: the monotonic start timestamp becomes wall-clock
// time with µs precision; a stopped kubelet or a missing or future
// timestamp is an error.
func TestStartedFromShow(t *testing.T) {
	now := time.Date(2026, 12, 3, 7, 0, 10, 500_000_000, time.UTC)
	nowMono := 1000 * time.Second
	got, err := startedFromShow([]byte("ExecMainPID=412\nExecMainStartTimestampMonotonic=997250123\n"), now, nowMono)
	want := now.Add(-2749877 * time.Microsecond)
	if err != nil || !got.Equal(want) {
		t.Fatalf("started %v %v, want %v", got, err, want)
	}
	for _, out := range []string{
		"ExecMainPID=0\nExecMainStartTimestampMonotonic=0\n",
		"ExecMainPID=412\nExecMainStartTimestampMonotonic=\n",
		"ExecMainPID=412\nExecMainStartTimestampMonotonic=2000000000\n",
		"",
	} {
		if got, err := startedFromShow([]byte(out), now, nowMono); err == nil {
			t.Errorf("%q: %v accepted", out, got)
		}
	}
}
