package systemdconn

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"

	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
)

// conn is one made connection: go-systemd's D-Bus client for units, and a
// plain system-bus connection for org.freedesktop.machine1, whose go-systemd
// client (machine1) takes no context and so could not be bounded. bus is nil
// for a Client with NoMachined.
type conn struct {
	sd  *sddbus.Conn
	bus *godbus.Conn
}

// dial connects to the systemd at address ("" is this machine's own: its
// private socket when root, else the system bus) and, unless noMachined, to
// machined on the same bus (the system bus when address is ""), bounded by
// ctx.
func dial(ctx context.Context, address string, noMachined bool) (*conn, error) {
	var (
		sd  *sddbus.Conn
		err error
	)
	if address != "" {
		sd, err = sddbus.NewConnection(func() (*godbus.Conn, error) { return DialBus(ctx, address) })
		if err != nil {
			return nil, fmt.Errorf("connect to systemd at %s: %w", address, err)
		}
	} else {
		sd, err = sddbus.NewWithContext(ctx)
		if err != nil {
			return nil, fmt.Errorf("connect to systemd over D-Bus: %w", err)
		}
	}
	if noMachined {
		return &conn{sd: sd}, nil
	}
	var bus *godbus.Conn
	if address != "" {
		bus, err = DialBus(ctx, address)
		if err != nil {
			err = fmt.Errorf("connect to machined at %s: %w", address, err)
		}
	} else {
		bus, err = godbus.ConnectSystemBus(godbus.WithContext(ctx))
		if err != nil {
			err = fmt.Errorf("connect to the D-Bus system bus (machined): %w", err)
		}
	}
	if err != nil {
		sd.Close()
		return nil, err
	}
	return &conn{sd: sd, bus: bus}, nil
}

func (c *conn) close() {
	c.sd.Close()
	if c.bus != nil {
		c.bus.Close()
	}
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

// noSuchUnit is systemd's error for a unit it has not loaded (and, for a
// stop, one that is not loaded and inactive).
const noSuchUnit = "org.freedesktop.systemd1.NoSuchUnit"

func isNoSuchUnit(err error) bool {
	var de godbus.Error
	return errors.As(err, &de) && de.Name == noSuchUnit
}

// StartUnit queues a start job (mode "replace") and waits for its result;
// a result other than "done" is an error naming the unit and the result.
func (c *Client) StartUnit(ctx context.Context, name string) error {
	cn, err := c.get(ctx)
	if err != nil {
		return err
	}
	ch := make(chan string, 1)
	if _, err := cn.sd.StartUnitContext(ctx, name, "replace", ch); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	return waitJob(ctx, "start", name, ch)
}

// StopUnit queues a stop job (mode "replace") and waits for its result, as
// StartUnit; a unit systemd does not know is stopped already.
func (c *Client) StopUnit(ctx context.Context, name string) error {
	cn, err := c.get(ctx)
	if err != nil {
		return err
	}
	ch := make(chan string, 1)
	_, err = cn.sd.StopUnitContext(ctx, name, "replace", ch)
	if isNoSuchUnit(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stop %s: %w", name, err)
	}
	return waitJob(ctx, "stop", name, ch)
}

// waitJob waits for a queued job's result, bounded by ctx. go-systemd
// delivers the result on ch when systemd signals JobRemoved.
func waitJob(ctx context.Context, what, name string, ch <-chan string) error {
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

// RestartUnit queues a restart job (mode "replace"; it also starts an
// inactive unit) and does not wait for it.
func (c *Client) RestartUnit(ctx context.Context, name string) error {
	cn, err := c.get(ctx)
	if err != nil {
		return err
	}
	if _, err := cn.sd.RestartUnitContext(ctx, name, "replace", nil); err != nil {
		return fmt.Errorf("restart %s: %w", name, err)
	}
	return nil
}

// Reload is a daemon-reload; it returns once systemd has reloaded.
func (c *Client) Reload(ctx context.Context) error {
	cn, err := c.get(ctx)
	if err != nil {
		return err
	}
	if err := cn.sd.ReloadContext(ctx); err != nil {
		return fmt.Errorf("systemd daemon-reload: %w", err)
	}
	return nil
}

// UnitState returns the unit's ActiveState and SubState ("inactive",
// "dead" for a unit systemd never loaded).
func (c *Client) UnitState(ctx context.Context, name string) (string, string, error) {
	cn, err := c.get(ctx)
	if err != nil {
		return "", "", err
	}
	props, err := cn.sd.GetUnitPropertiesContext(ctx, name)
	if err != nil {
		return "", "", fmt.Errorf("state of unit %s: %w", name, err)
	}
	active, _ := props["ActiveState"].(string)
	sub, _ := props["SubState"].(string)
	return active, sub, nil
}

// ServiceStatus is what Client.ServiceStatus reads of a service unit.
type ServiceStatus struct {
	ActiveState  string // active, activating, failed, ...
	SubState     string // running, auto-restart, ...
	MainPID      uint32
	NRestarts    uint32 // automatic restarts (Restart=)
	InvocationID string // hex; a new one per start, automatic restarts included
}

// ServiceStatus returns a service unit's states, main process, automatic
// restarts and invocation (lib/upgrade's health gate).
func (c *Client) ServiceStatus(ctx context.Context, name string) (ServiceStatus, error) {
	var st ServiceStatus
	cn, err := c.get(ctx)
	if err != nil {
		return st, err
	}
	props, err := cn.sd.GetUnitPropertiesContext(ctx, name)
	if err != nil {
		return st, fmt.Errorf("properties of %s: %w", name, err)
	}
	st.ActiveState, _ = props["ActiveState"].(string)
	st.SubState, _ = props["SubState"].(string)
	if id, ok := props["InvocationID"].([]byte); ok {
		st.InvocationID = hex.EncodeToString(id)
	}
	svc, err := cn.sd.GetUnitTypePropertiesContext(ctx, name, "Service")
	if err != nil {
		return st, fmt.Errorf("service properties of %s: %w", name, err)
	}
	st.MainPID, _ = svc["MainPID"].(uint32)
	st.NRestarts, _ = svc["NRestarts"].(uint32)
	return st, nil
}

// ResetFailed clears a failed unit's state; a unit that is not failed or
// not loaded is not an error.
func (c *Client) ResetFailed(ctx context.Context, name string) error {
	cn, err := c.get(ctx)
	if err != nil {
		return err
	}
	err = cn.sd.ResetFailedUnitContext(ctx, name)
	if isNoSuchUnit(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reset-failed %s: %w", name, err)
	}
	return nil
}

// ListUnitsByPatterns returns the names of the units systemd has loaded
// (in any state) whose names match one of the glob patterns
// (lib/reset.UnitLister).
func (c *Client) ListUnitsByPatterns(ctx context.Context, patterns []string) ([]string, error) {
	cn, err := c.get(ctx)
	if err != nil {
		return nil, err
	}
	st, err := cn.sd.ListUnitsByPatternsContext(ctx, nil, patterns)
	if err != nil {
		return nil, fmt.Errorf("list units matching %v: %w", patterns, err)
	}
	out := make([]string, 0, len(st))
	for _, s := range st {
		out = append(out, s.Name)
	}
	return out, nil
}

const (
	machinedDest    = "org.freedesktop.machine1"
	machinedPath    = "/org/freedesktop/machine1"
	machinedManager = "org.freedesktop.machine1.Manager"
	machinedMachine = "org.freedesktop.machine1.Machine"
	noSuchMachine   = "org.freedesktop.machine1.NoSuchMachine"
)

// errNoMachined is returned by the machine calls of a Client with
// NoMachined.
var errNoMachined = errors.New("machined: this client does not connect to it")

func (c *Client) machined(ctx context.Context) (*godbus.Conn, error) {
	cn, err := c.get(ctx)
	if err != nil {
		return nil, err
	}
	if cn.bus == nil {
		return nil, errNoMachined
	}
	return cn.bus, nil
}

// Machine asks machined about a machine; hostapi.ErrNoMachine when it has
// none.
func (c *Client) Machine(ctx context.Context, name string) (hostapi.Machine, error) {
	bus, err := c.machined(ctx)
	if err != nil {
		return hostapi.Machine{}, err
	}
	var p godbus.ObjectPath
	err = bus.Object(machinedDest, machinedPath).CallWithContext(ctx, machinedManager+".GetMachine", 0, name).Store(&p)
	if err != nil {
		return hostapi.Machine{}, machinedError("machine "+name, err)
	}
	var props map[string]godbus.Variant
	err = bus.Object(machinedDest, p).CallWithContext(ctx, "org.freedesktop.DBus.Properties.GetAll", 0, machinedMachine).Store(&props)
	if err != nil {
		return hostapi.Machine{}, machinedError("machine "+name, err)
	}
	m := hostapi.Machine{Name: name}
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

// TerminateMachine kills a machine's processes at once (no graceful
// shutdown).
func (c *Client) TerminateMachine(ctx context.Context, name string) error {
	bus, err := c.machined(ctx)
	if err != nil {
		return err
	}
	err = bus.Object(machinedDest, machinedPath).CallWithContext(ctx, machinedManager+".TerminateMachine", 0, name).Err
	if err != nil {
		return machinedError("terminate machine "+name, err)
	}
	return nil
}

// machinedError maps machined's "no such machine" (also what a machine that
// went away between two calls looks like: its object is gone) to
// hostapi.ErrNoMachine.
func machinedError(what string, err error) error {
	var de godbus.Error
	if errors.As(err, &de) && (de.Name == noSuchMachine || de.Name == "org.freedesktop.DBus.Error.UnknownObject") {
		return fmt.Errorf("%s: %w", what, hostapi.ErrNoMachine)
	}
	return fmt.Errorf("%s (machined over D-Bus): %w", what, err)
}
