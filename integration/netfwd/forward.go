package netfwd

import (
	"context"
	"fmt"
	"net"
)

// Forwarder accepts TCP connections on a listener inside one network namespace and proxies each to a target address
// dialed in another (typically: listen in a host's namespace, dial the machine's 127.0.0.1:PORT). It serves at most
// MaxConns connections at once. Close ends the listener and every connection and waits for its goroutines.
type Forwarder struct {
	s      *server
	target string
}

// Forward listens on listenAddr ("127.0.0.1:6443", "10.213.1.2:0") inside listenNS and forwards every connection
// to targetAddr dialed inside targetNS ("" is the test process's own namespace, the machine's). Addresses are
// numeric. The target is dialed per connection: a target that is down only fails the connections made meanwhile.
func Forward(listenNS, listenAddr, targetNS, targetAddr string) (*Forwarder, error) {
	if err := numeric(targetAddr); err != nil {
		return nil, err
	}
	l, err := Listen(listenNS, "tcp", listenAddr)
	if err != nil {
		return nil, fmt.Errorf("netfwd: forward %s: listen in %q: %w", listenAddr, listenNS, err)
	}
	f := &Forwarder{target: targetAddr}
	f.s = newServer(l, func(ctx context.Context, c net.Conn) {
		dctx, cancel := context.WithTimeout(ctx, DialTimeout)
		up, err := Dial(dctx, targetNS, "tcp", targetAddr)
		cancel()
		if err != nil || !f.s.upstream(up) {
			return // the client sees its connection closed
		}
		defer f.s.untrack(up)
		pipe(c, up)
	})
	f.s.start()
	return f, nil
}

// Addr is the listening address inside the listen namespace (the port chosen when listenAddr's was 0).
func (f *Forwarder) Addr() *net.TCPAddr { return f.s.l.Addr().(*net.TCPAddr) }

// Accepted is the number of connections accepted so far; Refused, those closed at once because MaxConns were open.
func (f *Forwarder) Accepted() int64 { return f.s.accepted.Load() }

// Refused is the number of connections closed at accept because MaxConns were already open.
func (f *Forwarder) Refused() int64 { return f.s.refused.Load() }

// Close stops listening, closes every forwarded connection and waits until all are gone. It is idempotent.
func (f *Forwarder) Close() error { return f.s.close() }
