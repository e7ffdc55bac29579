// Package systemdconn is kubeslot's one client of the host's systemd and
// machined over D-Bus (Client): dialled on first use, the dial bounded by
// DialTimeout, confined to the bus a sandboxed run is given (For, Refusal).
// Consumers declare the narrow interface they use (hostapi.Systemd,
// lib/reset.UnitLister, lib/upgrade.Systemd) and Client implements them
// all; sdtest is the matching fake for unit tests.
//
// Of kubeslot it imports lib/isolation/hostapi only (the Machine type), so
// the watcher can use it without linking the bootstrap's typed Kubernetes
// clientset. Imported by lib/stagekit, which connects for the stage
// binaries, by the stage packages (lib/bootstrap, lib/repave, lib/reset,
// lib/upgrade, lib/watcher), and lib/cli (Refusal, for --systemd-bus) only.
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
// context ends first is not (a later call may dial again).
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

// Client is kubeslot's one systemd client: go-systemd's D-Bus client for
// units and a system-bus connection for machined, made on first use so
// that a run refused before it touches the host (invalid configuration, busy
// lock, another installation, nothing to do) never needs the bus. Every
// method is bounded by its ctx. It implements each consumer's narrow
// interface: hostapi.Systemd (isolation.SystemdConn), lib/reset.UnitLister
// and lib/upgrade.Systemd.
type Client struct {
	// Ctx is the connection's lifetime (the process's context).
	Ctx context.Context
	// Address, when set, is the D-Bus address of the systemd to use (a
	// sandbox's system bus) instead of this machine's own.
	Address string
	// Refused, when set, is returned by every call instead of connecting:
	// the run's root prefix is not this machine's "/" and no Address was
	// given (For).
	Refused error
	// NoMachined connects to systemd only, never to machined (the
	// upgrader, which asks nothing of machines); Machine and
	// TerminateMachine then fail.
	NoMachined bool
	once       Once[*conn]
}

// EnvBus names the environment variable that sets the bus when no
// --systemd-bus flag does.
const EnvBus = "KUBESLOT_SYSTEMD_BUS"

// ErrNotConfined is returned (wrapped) when a stage whose root prefix is
// not "/" would act through this machine's own systemd.
var ErrNotConfined = errors.New("refusing to act on this machine's own systemd for a root prefix other than /")

// For returns the client a stage with root prefix prefix may use: with
// the prefix "/" this machine's systemd (or address when given); with any
// other prefix only the systemd at address, which the caller gives
// explicitly (--systemd-bus): a sandboxed run must never stop this
// machine's units or machines. Without an address, every call fails with
// an error wrapping ErrNotConfined, and nothing is dialled.
func For(ctx context.Context, prefix, address string) *Client {
	return &Client{Ctx: ctx, Address: address, Refused: Refusal(prefix, address)}
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

var _ hostapi.Systemd = (*Client)(nil) // isolation.SystemdConn

func (c *Client) get(ctx context.Context) (*conn, error) {
	if c.Refused != nil {
		return nil, c.Refused
	}
	return c.once.Get(ctx, c.Ctx, func(life context.Context) (*conn, error) {
		return dial(life, c.Address, c.NoMachined)
	})
}

// Close closes the connection if one was made.
func (c *Client) Close() {
	if cn, ok := c.once.Made(); ok {
		cn.close()
	}
}
