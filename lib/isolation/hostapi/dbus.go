package hostapi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

// DBus is the real Systemd: go-systemd's D-Bus client for units, and a plain
// system-bus connection for org.freedesktop.machine1, whose go-systemd
// client (machine1) takes no context and so could not be bounded.
type DBus struct {
	sd  *sddbus.Conn
	bus *godbus.Conn
}

var _ Systemd = (*DBus)(nil)

// DialSystemd connects to the local systemd (its private socket when root,
// else the system bus) and to the system bus for machined, bounded by ctx.
// The caller closes it.
func DialSystemd(ctx context.Context) (*DBus, error) {
	sd, err := sddbus.NewWithContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect to systemd over D-Bus: %w", err)
	}
	bus, err := godbus.ConnectSystemBus(godbus.WithContext(ctx))
	if err != nil {
		sd.Close()
		return nil, fmt.Errorf("connect to the D-Bus system bus (machined): %w", err)
	}
	return &DBus{sd: sd, bus: bus}, nil
}

// DialSystemdAt connects to the systemd and machined that answer on the
// D-Bus address given (a sandbox's system bus, e.g.
// unix:path=/proc/PID/root/run/dbus/system_bus_socket): two connections,
// each authenticated as this user and past Hello, bounded by ctx. The
// caller closes it.
func DialSystemdAt(ctx context.Context, address string) (*DBus, error) {
	dial := func() (*godbus.Conn, error) { return DialBus(ctx, address) }
	sd, err := sddbus.NewConnection(dial)
	if err != nil {
		return nil, fmt.Errorf("connect to systemd at %s: %w", address, err)
	}
	bus, err := dial()
	if err != nil {
		sd.Close()
		return nil, fmt.Errorf("connect to machined at %s: %w", address, err)
	}
	return &DBus{sd: sd, bus: bus}, nil
}

// DialBus connects to the D-Bus address, authenticates as this user and
// says Hello, bounded by ctx. The connection is not tied to ctx: godbus
// closes a connection when the context it was dialled with ends, and callers
// pass a short dial bound, not the connection's lifetime. The caller closes
// it.
func DialBus(ctx context.Context, address string) (*godbus.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	conn, err := godbus.Dial(address)
	if err != nil {
		return nil, err
	}
	res := make(chan error, 1)
	go func() {
		err := conn.Auth([]godbus.Auth{godbus.AuthExternal(strconv.Itoa(os.Getuid()))})
		if err == nil {
			err = conn.Hello()
		}
		res <- err
	}()
	select {
	case err = <-res:
	case <-ctx.Done():
		// Closing unblocks Auth or Hello.
		conn.Close()
		<-res
		err = context.Cause(ctx)
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// Close closes both connections.
func (d *DBus) Close() error {
	d.sd.Close()
	return d.bus.Close()
}

type jobFunc func(ctx context.Context, name, mode string, ch chan<- string) (int, error)

// job queues a job and waits for its result. go-systemd delivers the result
// on ch when systemd signals JobRemoved.
func job(ctx context.Context, what, name string, f jobFunc) error {
	ch := make(chan string, 1)
	if _, err := f(ctx, name, "replace", ch); err != nil {
		return fmt.Errorf("%s %s: %w", what, name, err)
	}
	select {
	case res := <-ch:
		if res != "done" {
			return fmt.Errorf("%s %s: job %s (see journalctl -u %s)", what, name, res, name)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s %s: waiting for the job: %w", what, name, context.Cause(ctx))
	}
}

// StartUnit implements Systemd.
func (d *DBus) StartUnit(ctx context.Context, name string) error {
	return job(ctx, "start", name, d.sd.StartUnitContext)
}

// StopUnit implements Systemd.
func (d *DBus) StopUnit(ctx context.Context, name string) error {
	return job(ctx, "stop", name, d.sd.StopUnitContext)
}

// Reload implements Systemd.
func (d *DBus) Reload(ctx context.Context) error {
	if err := d.sd.ReloadContext(ctx); err != nil {
		return fmt.Errorf("systemd daemon-reload: %w", err)
	}
	return nil
}

// UnitState implements Systemd.
func (d *DBus) UnitState(ctx context.Context, name string) (string, string, error) {
	props, err := d.sd.GetUnitPropertiesContext(ctx, name)
	if err != nil {
		return "", "", fmt.Errorf("state of unit %s: %w", name, err)
	}
	active, _ := props["ActiveState"].(string)
	sub, _ := props["SubState"].(string)
	return active, sub, nil
}

// ResetFailed implements Systemd.
func (d *DBus) ResetFailed(ctx context.Context, name string) error {
	err := d.sd.ResetFailedUnitContext(ctx, name)
	var de godbus.Error
	if errors.As(err, &de) && de.Name == "org.freedesktop.systemd1.NoSuchUnit" {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reset-failed %s: %w", name, err)
	}
	return nil
}

const (
	machinedDest    = "org.freedesktop.machine1"
	machinedPath    = "/org/freedesktop/machine1"
	machinedManager = "org.freedesktop.machine1.Manager"
	machinedMachine = "org.freedesktop.machine1.Machine"
	noSuchMachine   = "org.freedesktop.machine1.NoSuchMachine"
)

// Machine implements Systemd.
func (d *DBus) Machine(ctx context.Context, name string) (Machine, error) {
	var p godbus.ObjectPath
	err := d.bus.Object(machinedDest, machinedPath).CallWithContext(ctx, machinedManager+".GetMachine", 0, name).Store(&p)
	if err != nil {
		return Machine{}, machinedError("machine "+name, err)
	}
	var props map[string]godbus.Variant
	err = d.bus.Object(machinedDest, p).CallWithContext(ctx, "org.freedesktop.DBus.Properties.GetAll", 0, machinedMachine).Store(&props)
	if err != nil {
		return Machine{}, machinedError("machine "+name, err)
	}
	m := Machine{Name: name}
	if v, ok := props["State"].Value().(string); ok {
		m.State = v
	}
	if v, ok := props["Leader"].Value().(uint32); ok {
		m.Leader = int(v)
	}
	if v, ok := props["Class"].Value().(string); ok {
		m.Class = v
	}
	if v, ok := props["Service"].Value().(string); ok {
		m.Service = v
	}
	return m, nil
}

// TerminateMachine implements Systemd.
func (d *DBus) TerminateMachine(ctx context.Context, name string) error {
	err := d.bus.Object(machinedDest, machinedPath).CallWithContext(ctx, machinedManager+".TerminateMachine", 0, name).Err
	if err != nil {
		return machinedError("terminate machine "+name, err)
	}
	return nil
}

// machinedError maps machined's "no such machine" (also what a machine that
// went away between two calls looks like: its object is gone) to
// ErrNoMachine.
func machinedError(what string, err error) error {
	var de godbus.Error
	if errors.As(err, &de) && (de.Name == noSuchMachine || de.Name == "org.freedesktop.DBus.Error.UnknownObject") {
		return fmt.Errorf("%s: %w", what, ErrNoMachine)
	}
	return fmt.Errorf("%s (machined over D-Bus): %w", what, err)
}

// ListUnitsByPatterns returns the names of the units systemd has loaded
// (in any state) whose names match one of the glob patterns. Not part of
// Systemd: only the resetter needs it (lib/reset.UnitLister).
func (d *DBus) ListUnitsByPatterns(ctx context.Context, patterns []string) ([]string, error) {
	st, err := d.sd.ListUnitsByPatternsContext(ctx, nil, patterns)
	if err != nil {
		return nil, fmt.Errorf("list units matching %v: %w", patterns, err)
	}
	out := make([]string, 0, len(st))
	for _, s := range st {
		out = append(out, s.Name)
	}
	return out, nil
}
