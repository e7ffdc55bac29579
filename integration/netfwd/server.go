package netfwd

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// MaxConns bounds the connections one Forwarder or ConnectProxy serves at once; further ones are closed at accept.
const MaxConns = 256

// DialTimeout bounds each upstream dial.
const DialTimeout = 10 * time.Second

// server is the accept loop and connection bookkeeping Forwarder and ConnectProxy share: Close closes the listener
// and every connection, then waits for every goroutine it started.
type server struct {
	l      net.Listener
	handle func(ctx context.Context, c net.Conn)
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool

	accepted atomic.Int64
	refused  atomic.Int64

	closeOnce sync.Once
	closeErr  error
}

func newServer(l net.Listener, handle func(ctx context.Context, c net.Conn)) *server {
	s := &server{l: l, handle: handle, conns: map[net.Conn]struct{}{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// start runs the accept loop; the owner calls it once it has stored s where handle finds it.
func (s *server) start() {
	s.wg.Add(1)
	go s.acceptLoop()
}

func (s *server) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.l.Accept()
		if err != nil {
			if s.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// EMFILE and the like: back off instead of spinning.
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
			continue
		}
		if !s.track(c) {
			s.refused.Add(1)
			c.Close()
			continue
		}
		s.accepted.Add(1)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.untrack(c)
			s.handle(s.ctx, c)
		}()
	}
}

// track registers a connection; false when the server is closed or full.
func (s *server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || len(s.conns) >= MaxConns {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *server) untrack(c net.Conn) {
	c.Close()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// upstream registers a connection the server dialed, so that Close ends it too; false (and c closed) when the
// server is closing.
func (s *server) upstream(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		c.Close()
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *server) close() error {
	s.closeOnce.Do(func() {
		s.cancel()
		s.closeErr = s.l.Close()
		if errors.Is(s.closeErr, net.ErrClosed) {
			s.closeErr = nil
		}
		s.mu.Lock()
		s.closed = true
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s.closeErr
}

// pipe copies both ways until both directions ended (half-closing TCP as each side finishes) or one failed, then
// closes both.
func pipe(a, b net.Conn) {
	done := make(chan struct{})
	cp := func(dst, src net.Conn) {
		_, err := io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok && err == nil {
			_ = cw.CloseWrite()
		} else {
			a.Close()
			b.Close()
		}
	}
	go func() {
		defer close(done)
		cp(a, b)
	}()
	cp(b, a)
	<-done
	a.Close()
	b.Close()
}
