package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Bounds of the endpoint: a scraper that stalls or floods cannot hold the
// watcher's memory or goroutines.
const (
	readHeaderTimeout = 5 * time.Second
	writeTimeout      = 30 * time.Second
	idleTimeout       = 60 * time.Second
	maxHeaderBytes    = 8 << 10
	// scrapeTimeout bounds gathering one answer (all in memory: fast).
	scrapeTimeout = 10 * time.Second
	// maxInFlight scrapes at once; more get 503.
	maxInFlight = 2
	// shutdownTimeout bounds the graceful stop before connections are cut.
	shutdownTimeout = 5 * time.Second
	// Path is where the metrics are served.
	Path = "/metrics"
)

// Server is the endpoint, listening.
type Server struct {
	srv  *http.Server
	ln   net.Listener
	done chan struct{}
}

// Listen binds addr (host:port, validated by lib/config) and serves w's
// registry on Path until Close. The error names the address (a port in use
// says so): the caller decides what a failure means.
func Listen(addr string, w *Watcher, log *slog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics endpoint: listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle(Path, promhttp.HandlerFor(w.reg, promhttp.HandlerOpts{
		ErrorLog: slogPrinter{log}, MaxRequestsInFlight: maxInFlight, Timeout: scrapeTimeout,
	}))
	s := &Server{ln: ln, done: make(chan struct{}), srv: &http.Server{Handler: mux,
		ReadHeaderTimeout: readHeaderTimeout, ReadTimeout: readHeaderTimeout, WriteTimeout: writeTimeout,
		IdleTimeout: idleTimeout, MaxHeaderBytes: maxHeaderBytes,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("metrics endpoint stopped", "addr", ln.Addr().String(), "err", err.Error())
		}
	}()
	log.Info("serving metrics", "addr", ln.Addr().String(), "path", Path)
	return s, nil
}

// Addr is the address the endpoint listens on (the port chosen, for ":0").
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the endpoint: scrapes under way get shutdownTimeout to
// finish, then their connections are cut.
func (s *Server) Close() {
	if s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		_ = s.srv.Close()
	}
	<-s.done
}

// slogPrinter is promhttp's error log (gathering or encoding failures).
type slogPrinter struct{ log *slog.Logger }

func (p slogPrinter) Println(v ...any) { p.log.Warn("metrics endpoint: " + fmt.Sprint(v...)) }
