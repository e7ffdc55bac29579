// Package systemdconn is the stages' connection to the host's systemd: a
// D-Bus client (lib/isolation/hostapi.DBus) dialled on first use and bounded
// by DialTimeout, implementing hostapi.Systemd (isolation.SystemdConn) and
// reset.UnitLister.
//
// It imports lib/isolation/hostapi only (and through it go-systemd and
// godbus), so the watcher can use it without linking the bootstrap's typed
// Kubernetes clientset. Imported by the stage binaries (cmd/kubeslot-bootstrap,
// cmd/kubeslot-repaver, cmd/kubeslot-resetter, cmd/kubeslot-watcher).
package systemdconn

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
)

// Lazy connects to systemd over D-Bus on first use, so that a run
// refused before it touches the host (invalid configuration, busy lock,
// another installation) never needs the bus. Ctx is the connection's
// lifetime (the process's context): go-systemd and godbus close a
// connection when the context it was dialled with ends, so the dial is
// bounded by DialTimeout separately.
type Lazy struct {
	Ctx  context.Context
	mu   sync.Mutex
	conn *hostapi.DBus
	err  error
}

// DialTimeout bounds connecting to systemd.
const DialTimeout = 30 * time.Second

var _ hostapi.Systemd = (*Lazy)(nil) // isolation.SystemdConn

func (l *Lazy) get(ctx context.Context) (*hostapi.DBus, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil || l.err != nil {
		return l.conn, l.err
	}
	life := l.Ctx
	if life == nil {
		life = context.Background()
	}
	type result struct {
		c   *hostapi.DBus
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := hostapi.DialSystemd(life)
		ch <- result{c, err}
	}()
	t := time.NewTimer(DialTimeout)
	defer t.Stop()
	select {
	case r := <-ch:
		l.conn, l.err = r.c, r.err
	case <-t.C:
		l.err = fmt.Errorf("connect to systemd over D-Bus: no answer within %s", DialTimeout)
	case <-ctx.Done():
		// Not sticky: a later call with a live context may dial again.
		return nil, fmt.Errorf("connect to systemd over D-Bus: %w", context.Cause(ctx))
	}
	return l.conn, l.err
}

// Close closes the connection if one was made.
func (l *Lazy) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		l.conn.Close()
	}
}

// The methods below implement hostapi.Systemd over the lazily made
// connection.

// StartUnit starts a unit and waits for its job.
func (l *Lazy) StartUnit(ctx context.Context, name string) error {
	c, err := l.get(ctx)
	if err != nil {
		return err
	}
	return c.StartUnit(ctx, name)
}

// StopUnit stops a unit and waits for its job.
func (l *Lazy) StopUnit(ctx context.Context, name string) error {
	c, err := l.get(ctx)
	if err != nil {
		return err
	}
	return c.StopUnit(ctx, name)
}

// Reload is a daemon-reload.
func (l *Lazy) Reload(ctx context.Context) error {
	c, err := l.get(ctx)
	if err != nil {
		return err
	}
	return c.Reload(ctx)
}

// UnitState returns ActiveState and SubState.
func (l *Lazy) UnitState(ctx context.Context, name string) (string, string, error) {
	c, err := l.get(ctx)
	if err != nil {
		return "", "", err
	}
	return c.UnitState(ctx, name)
}

// ResetFailed clears a failed state.
func (l *Lazy) ResetFailed(ctx context.Context, name string) error {
	c, err := l.get(ctx)
	if err != nil {
		return err
	}
	return c.ResetFailed(ctx, name)
}

// Machine asks machined about a machine.
func (l *Lazy) Machine(ctx context.Context, name string) (hostapi.Machine, error) {
	c, err := l.get(ctx)
	if err != nil {
		return hostapi.Machine{}, err
	}
	return c.Machine(ctx, name)
}

// TerminateMachine kills a machine at once.
func (l *Lazy) TerminateMachine(ctx context.Context, name string) error {
	c, err := l.get(ctx)
	if err != nil {
		return err
	}
	return c.TerminateMachine(ctx, name)
}

// ListUnitsByPatterns lists the loaded units matching the glob patterns
// (lib/reset.UnitLister).
func (l *Lazy) ListUnitsByPatterns(ctx context.Context, patterns []string) ([]string, error) {
	c, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return c.ListUnitsByPatterns(ctx, patterns)
}
