package artifact

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sync"
	"time"
)

var (
	defaultClientOnce sync.Once
	defaultClient     *http.Client
)

func (f *Fetcher) client() *http.Client {
	if f.Client != nil {
		return f.Client
	}
	defaultClientOnce.Do(func() {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.ResponseHeaderTimeout = 30 * time.Second
		defaultClient = &http.Client{Transport: t}
	})
	return defaultClient
}

// download fetches src into the cache, retrying transient failures. ctx
// carries the whole-download deadline.
func (f *Fetcher) download(ctx context.Context, src *url.URL, want, dst string, log *slog.Logger) error {
	retries := f.Retries
	switch {
	case retries == 0:
		retries = DefaultRetries
	case retries < 0:
		retries = 0
	}
	attempts := retries + 1
	for attempt := 1; ; attempt++ {
		retry, err := f.attempt(ctx, src, want, dst, log.With("attempt", attempt, "attempts", attempts))
		if err == nil {
			return nil
		}
		if cause := context.Cause(ctx); cause != nil {
			// The whole-download deadline, or the caller gave up: the
			// attempt's own error is only a consequence.
			return fmt.Errorf("download %w (attempt %d of %d)", cause, attempt, attempts)
		}
		if !retry {
			return fmt.Errorf("download: %w (attempt %d of %d, not retried)", err, attempt, attempts)
		}
		if attempt >= attempts {
			return fmt.Errorf("download: %w (attempt %d of %d, giving up)", err, attempt, attempts)
		}
		wait := f.backoff(attempt)
		log.Warn("artifact download failed; retrying", "attempt", attempt, "attempts", attempts,
			"retry_in", wait, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("download %w (after attempt %d of %d failed: %v)", context.Cause(ctx), attempt, attempts, err)
		case <-t.C:
		}
	}
}

// errStalled cancels an attempt whose body went quiet.
var errStalled = errors.New("stalled")

// attempt makes one request. retry says whether a failure is transient.
func (f *Fetcher) attempt(ctx context.Context, src *url.URL, want, dst string, log *slog.Logger) (retry bool, err error) {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	req, err := http.NewRequestWithContext(actx, http.MethodGet, src.String(), nil)
	if err != nil {
		return false, cleanURLError(err)
	}
	// Ask for the bytes as stored: a transparently decompressed body would
	// not match the digest.
	req.Header.Set("Accept-Encoding", "identity")
	log.Info("downloading artifact")
	start := time.Now()
	resp, err := f.client().Do(req)
	if err != nil {
		return true, cleanURLError(err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK:
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return true, fmt.Errorf("server answered %s", resp.Status)
	default:
		return false, fmt.Errorf("server answered %s", resp.Status)
	}
	if max := f.maxSize(); resp.ContentLength > max {
		return false, fmt.Errorf("%w: Content-Length %d, bound %d", ErrTooLarge, resp.ContentLength, max)
	}

	stall := f.StallTimeout
	if stall <= 0 {
		stall = DefaultStallTimeout
	}
	body := &watchdog{r: resp.Body, d: stall, t: time.AfterFunc(stall, func() { cancel(errStalled) })}
	defer body.t.Stop()
	n, err := f.store(actx, body, resp.ContentLength, want, dst, log)
	if err != nil {
		var re *readError
		if errors.As(err, &re) {
			if errors.Is(context.Cause(actx), errStalled) {
				return true, fmt.Errorf("read: no data for %s after %d bytes", stall, n)
			}
			return true, fmt.Errorf("read: %w", cleanURLError(re.err))
		}
		return false, err
	}
	logDone(log, "artifact downloaded and verified", n, time.Since(start))
	return false, nil
}

// watchdog restarts its timer on every read that returns data.
type watchdog struct {
	r io.Reader
	d time.Duration
	t *time.Timer
}

func (w *watchdog) Read(p []byte) (int, error) {
	n, err := w.r.Read(p)
	if n > 0 {
		w.t.Reset(w.d)
	}
	return n, err
}

// cleanURLError drops the *url.Error wrapper, whose text holds the full URL
// with its query; callers name the source themselves, redacted.
func cleanURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func (f *Fetcher) backoff(attempt int) time.Duration {
	if f.Backoff != nil {
		return f.Backoff(attempt)
	}
	return DefaultBackoff(attempt)
}

// DefaultBackoff waits 1 s, 2 s, 4 s, ... capped at MaxBackoff, with "equal
// jitter": a random point in the upper half, so many nodes fetching from one
// mirror after an outage do not retry in step.
func DefaultBackoff(attempt int) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	d := MaxBackoff
	if attempt <= 6 {
		d = min(time.Second<<(attempt-1), MaxBackoff)
	}
	return d/2 + rand.N(d/2+1)
}
