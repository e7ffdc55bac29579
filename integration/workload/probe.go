package workload

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/kubeslot/kubeslot/integration/netfwd"
)

// HostClient is an HTTP client whose connections start inside the network
// namespace at nsPath (a test host's, outside its node machine): timeout
// bounds each request, no connection is reused, tlsCfg may be nil.
func HostClient(nsPath string, timeout time.Duration, tlsCfg *tls.Config) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true,
		TLSClientConfig: tlsCfg,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return netfwd.Dial(ctx, nsPath, network, addr)
		}}}
}

// Get GETs u with c and returns the body (its first 64 KiB); a status other
// than 200 is an error that comes with the body.
func Get(ctx context.Context, c *http.Client, u string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return string(b), err
}

// Prober asks a workload every 100 ms whether it answers and remembers
// when it did, to measure an outage.
type Prober struct {
	mu   sync.Mutex
	ok   []time.Time
	stop func()
}

// StartProbe starts asking answers (bounded by its context) until Stop.
func StartProbe(answers func(ctx context.Context) bool) *Prober {
	pr := &Prober{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	pr.stop = func() { cancel(); <-done }
	go func() {
		defer close(done)
		for {
			if answers(ctx) {
				pr.mu.Lock()
				pr.ok = append(pr.ok, time.Now())
				pr.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return pr
}

// Stop ends the probe and waits for it.
func (pr *Prober) Stop() { pr.stop() }

// Downtime waits (bounded) until the workload has answered for a second
// past this call, then returns the longest gap between two answers from the
// last one before since on, with the answers that bound it: the last before
// the outage and the first after it. Past bound it returns what it has and
// an error.
//
// The caller has seen the disruption's operation end, so any outage began
// before this call; it may still be going on (a pod status can read Ready
// before the new node's kubelet has reported), which is why the answers must
// go on past the call: one that ended a moment before it, or one still
// running, is then measured whole, never as the probe's 0.1 s.
func (pr *Prober) Downtime(ctx context.Context, since time.Time, bound time.Duration) (gap time.Duration, last, first time.Time, err error) {
	called := time.Now()
	deadline := called.Add(bound)
	for {
		pr.mu.Lock()
		var prev time.Time
		gap, last, first = 0, time.Time{}, time.Time{}
		for _, at := range pr.ok {
			if !prev.IsZero() && !at.Before(since) && at.Sub(prev) > gap {
				gap, last, first = at.Sub(prev), prev, at
			}
			prev = at
		}
		pr.mu.Unlock()
		if gap > 0 && prev.Sub(called) >= time.Second {
			return gap, last, first, nil
		}
		if time.Now().After(deadline) {
			return gap, last, first, fmt.Errorf("no steady answer on the hostPort within %s after %s", bound, called.Format("15:04:05"))
		}
		select {
		case <-ctx.Done():
			return gap, last, first, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
