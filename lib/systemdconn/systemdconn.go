// Package systemdconn is the stages' connection to the host's systemd: a
// D-Bus client (lib/isolation/hostapi.DBus) dialled on first use and bounded
// by DialTimeout, implementing hostapi.Systemd (isolation.SystemdConn) and
// reset.UnitLister; Once is that first-use, bounded dial for any client.
//
// It imports lib/isolation/hostapi only (and through it go-systemd and
// godbus), so the watcher can use it without linking the bootstrap's typed
// Kubernetes clientset. Imported by the stage binaries' mains (cmd/kubeslot-*
// but the kubeslot CLI), lib/cli (Refusal, for --systemd-bus) and
// lib/upgrade (Once) only.
package systemdconn

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
)

// Once makes a connection on first use, at most once: the dial runs with
// the connection's lifetime context and is bounded by DialTimeout apart
// from it, since go-systemd and godbus close a connection when the context
// it was dialled with ends. A failed dial is remembered; a caller whose own
// context ends first is not (a later call may dial again). Shared by Lazy
// and lib/upgrade's systemd client.
type Once[C any] struct {
	mu   sync.Mutex
	conn C
	made bool
	err  error
}

// Get returns the connection, dialling it with dial on the first call.
func (o *Once[C]) Get(ctx, life context.Context, dial func(context.Context) (C, error)) (C, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.made || o.err != nil {
		return o.conn, o.err
	}
	if life == nil {
		life = context.Background()
	}
	type result struct {
		c   C
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := dial(life)
		ch <- result{c, err}
	}()
	t := time.NewTimer(DialTimeout)
	defer t.Stop()
	var zero C
	select {
	case r := <-ch:
		if r.err != nil {
			o.err = r.err
			return zero, o.err
		}
		o.conn, o.made = r.c, true
	case <-t.C:
		o.err = fmt.Errorf("connect to systemd over D-Bus: no answer within %s", DialTimeout)
	case <-ctx.Done():
		return zero, fmt.Errorf("connect to systemd over D-Bus: %w", context.Cause(ctx))
	}
	return o.conn, o.err
}

// Made returns the connection if one was made.
func (o *Once[C]) Made() (C, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.conn, o.made
}

// Lazy connects to systemd over D-Bus on first use, so that a run
// refused before it touches the host (invalid configuration, busy lock,
// another installation) never needs the bus. Ctx is the connection's
// lifetime (the process's context).
type Lazy struct {
	Ctx context.Context
	// Address, when set, is the D-Bus address of the systemd to use (a
	// sandbox's system bus) instead of this machine's own.
	Address string
	// Refused, when set, is returned by every call instead of connecting:
	// the run's root prefix is not this machine's "/" and no Address was
	// given (For).
	Refused error
	once    Once[*hostapi.DBus]
}

// EnvBus names the environment variable that sets the bus when no
// --systemd-bus flag does.
const EnvBus = "KUBESLOT_SYSTEMD_BUS"

// ErrNotConfined is returned (wrapped) when a stage whose root prefix is
// not "/" would act through this machine's own systemd.
var ErrNotConfined = errors.New("refusing to act on this machine's own systemd for a root prefix other than /")

// For returns the connection a stage with root prefix prefix may use: with
// the prefix "/" this machine's systemd (or address when given); with any
// other prefix only the systemd at address, which the caller gives
// explicitly (--systemd-bus): a sandboxed run must never stop this
// machine's units or machines. Without an address, every call fails with
// an error wrapping ErrNotConfined, and nothing is dialled.
func For(ctx context.Context, prefix, address string) *Lazy {
	return &Lazy{Ctx: ctx, Address: address, Refused: Refusal(prefix, address)}
}

// Refusal is the error (wrapping ErrNotConfined) every systemd call of a
// stage with root prefix prefix and bus address would fail with, or nil
// when it may reach systemd. lib/cli checks it at start-up, so a stage that
// needs systemd refuses before it changes anything, not at its first call.
func Refusal(prefix, address string) error {
	if address == "" && filepath.Clean(prefix) != "/" {
		return fmt.Errorf("%w (--root-prefix %s): give the D-Bus address of the systemd that manages that root with --systemd-bus ADDRESS (or %s), e.g. unix:path=/proc/PID/root/run/dbus/system_bus_socket", ErrNotConfined, prefix, EnvBus)
	}
	return nil
}

// DialTimeout bounds connecting to systemd.
const DialTimeout = 30 * time.Second

var _ hostapi.Systemd = (*Lazy)(nil) // isolation.SystemdConn

func (l *Lazy) get(ctx context.Context) (*hostapi.DBus, error) {
	if l.Refused != nil {
		return nil, l.Refused
	}
	if l.Address != "" {
		return l.once.Get(ctx, l.Ctx, func(life context.Context) (*hostapi.DBus, error) {
			return hostapi.DialSystemdAt(life, l.Address)
		})
	}
	return l.once.Get(ctx, l.Ctx, hostapi.DialSystemd)
}

// Close closes the connection if one was made.
func (l *Lazy) Close() {
	if c, ok := l.once.Made(); ok {
		c.Close()
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
