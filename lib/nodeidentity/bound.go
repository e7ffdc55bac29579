package nodeidentity

import (
	"context"
	"io"
	"net/http"
	"time"
)

// boundRequests bounds each request but a watch to d, from sending it to
// reading the end of its body. rest.Config.Timeout would be the obvious
// setting, but client-go applies it to watch streams too: an idle agent
// then reopens every watch every d, a list and a watch per object kind,
// forever. A watch is bounded by its server-side timeout instead, and the
// informer relists when it ends.
func boundRequests(d time.Duration) func(http.RoundTripper) http.RoundTripper {
	return func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if isWatch(req) {
				return rt.RoundTrip(req)
			}
			ctx, cancel := context.WithTimeout(req.Context(), d)
			resp, err := rt.RoundTrip(req.WithContext(ctx))
			if err != nil {
				cancel()
				return nil, err
			}
			resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
			return resp, nil
		})
	}
}

// isWatch reports whether req opens a watch stream (client-go sends
// ?watch=true).
func isWatch(req *http.Request) bool {
	switch req.URL.Query().Get("watch") {
	case "true", "1":
		return true
	}
	return false
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// cancelOnClose releases the request's deadline once the body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}
