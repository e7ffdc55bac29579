package netfwd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// ErrNoRoute is what a ConnectProxy route returns for a host it must not dial.
var ErrNoRoute = errors.New("no route to this host from the rig")

// Route maps the host of a CONNECT request (an IP address or a name) to the network namespace to dial it from
// ("" is the test process's own) and the numeric IP to dial there. It returns an error wrapping ErrNoRoute for
// hosts that must not be dialed at all: a route must never send traffic off the machine.
type Route func(host string) (nsPath string, ip string, err error)

// ConnectProxy is an HTTP CONNECT proxy: for each connection it reads one "CONNECT host:port" request, dials
// host:port inside the namespace the route names, answers 200 and then copies bytes both ways. It is what
// kube-apiserver's egress selector (proxyProtocol HTTPConnect) talks to; see kube.Options.ClusterEgress.
type ConnectProxy struct {
	s     *server
	route Route
	log   *slog.Logger
}

// ServeConnect serves CONNECT requests on l (a Unix socket listener for kube-apiserver) until Close. Refusals and
// dial failures are answered with an HTTP error status and logged on log (nil: discarded).
func ServeConnect(l net.Listener, route Route, log *slog.Logger) *ConnectProxy {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &ConnectProxy{route: route, log: log}
	p.s = newServer(l, p.handle)
	p.s.start()
	return p
}

func (p *ConnectProxy) handle(ctx context.Context, c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(DialTimeout))
	br := bufio.NewReader(io.LimitReader(c, http.DefaultMaxHeaderBytes))
	req, err := http.ReadRequest(br)
	if err != nil {
		p.log.Warn("egress: bad request", "err", err)
		return
	}
	reply := func(code int, why string) {
		fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
			code, http.StatusText(code), len(why), why)
	}
	if req.Method != http.MethodConnect {
		reply(http.StatusMethodNotAllowed, "CONNECT only\n")
		return
	}
	host, port, err := net.SplitHostPort(req.Host)
	if err != nil {
		reply(http.StatusBadRequest, err.Error()+"\n")
		return
	}
	ns, ip, err := p.route(host)
	if err != nil {
		p.log.Warn("egress: refused", "to", req.Host, "err", err)
		reply(http.StatusForbidden, err.Error()+"\n")
		return
	}
	target := net.JoinHostPort(ip, port)
	dctx, cancel := context.WithTimeout(ctx, DialTimeout)
	up, err := Dial(dctx, ns, "tcp", target)
	cancel()
	if err != nil {
		p.log.Warn("egress: dial failed", "to", req.Host, "dialed", target, "netns", ns, "err", err)
		reply(http.StatusBadGateway, err.Error()+"\n")
		return
	}
	if !p.s.upstream(up) {
		return
	}
	defer p.s.untrack(up)
	p.log.Debug("egress: connected", "to", req.Host, "dialed", target, "netns", ns)
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	// A client may have sent its first bytes right behind the request: they are in br, not in c any more.
	if n := br.Buffered(); n > 0 {
		early, _ := br.Peek(n)
		if _, err := up.Write(early); err != nil {
			return
		}
	}
	pipe(c, up)
}

// Accepted is the number of proxy connections accepted so far.
func (p *ConnectProxy) Accepted() int64 { return p.s.accepted.Load() }

// Close stops listening, closes every proxied connection and waits until all are gone. It is idempotent.
func (p *ConnectProxy) Close() error { return p.s.close() }
