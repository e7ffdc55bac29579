package systemdconn

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"

	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
)

// NodeBusSocket is the node's D-Bus system bus socket, inside the node.
// The node's systemd also listens on /run/systemd/private (what systemctl
// uses as root), but it refuses a peer whose process it cannot see: one in
// another PID namespace, as the host's processes are to a node.
const NodeBusSocket = "/run/dbus/system_bus_socket"

// Node is a connection to the systemd of a running node
// (hostapi.NodeSystemd) over the node's system bus, reached through the
// node leader's root, so no process starts in the node or on the host.
// Entering the node with nsenter to run systemctl took 20–30 ms of a loaded
// 2-CPU host per call, three times inside a repave's downtime.
type Node struct {
	sd      *sddbus.Conn
	address string
}

var _ hostapi.NodeSystemd = (*Node)(nil)

// DialNode connects to the systemd of the node whose init is the host
// process leader (hostapi.DialNode), bounded by ctx.
func DialNode(ctx context.Context, leader int) (hostapi.NodeSystemd, error) {
	if leader <= 0 {
		return nil, fmt.Errorf("connect to a node's systemd: no leader process (%d)", leader)
	}
	address := "unix:path=/proc/" + strconv.Itoa(leader) + "/root" + NodeBusSocket
	sd, err := sddbus.NewConnection(func() (*godbus.Conn, error) { return DialBus(ctx, address) })
	if err != nil {
		return nil, fmt.Errorf("connect to the node's systemd at %s: %w", address, err)
	}
	return &Node{sd: sd, address: address}, nil
}

// StartUnits queues a start job per unit and waits for all of them.
func (n *Node) StartUnits(ctx context.Context, names ...string) error {
	return n.jobs(ctx, "start", names, n.sd.StartUnitContext)
}

// StopUnits queues a stop job per unit and waits for all of them; a unit
// the node's systemd does not know is stopped already.
func (n *Node) StopUnits(ctx context.Context, names ...string) error {
	return n.jobs(ctx, "stop", names, n.sd.StopUnitContext)
}

// jobs queues one job per unit before it waits for any, so that they run
// side by side as systemctl's do, then waits for every result.
func (n *Node) jobs(ctx context.Context, what string, names []string,
	queue func(context.Context, string, string, chan<- string) (int, error)) error {
	chs := make([]chan string, len(names))
	var errs []error
	for i, name := range names {
		chs[i] = make(chan string, 1)
		_, err := queue(ctx, name, "replace", chs[i])
		switch {
		case what == "stop" && isNoSuchUnit(err):
			chs[i] = nil
		case err != nil:
			return fmt.Errorf("%s %s in the node: %w", what, name, err)
		}
	}
	for i, name := range names {
		if chs[i] != nil {
			errs = append(errs, waitJob(ctx, what, name, chs[i]))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("in the node: %w", err)
	}
	return nil
}

// Halt asks the node's systemd to halt without stopping its units
// (org.freedesktop.systemd1.Manager.Halt, what systemctl --force halt
// calls). It goes over a plain connection: go-systemd has no call for it.
func (n *Node) Halt(ctx context.Context) error {
	conn, err := DialBus(ctx, n.address)
	if err != nil {
		return fmt.Errorf("halt the node: connect to its systemd: %w", err)
	}
	defer conn.Close()
	err = conn.Object("org.freedesktop.systemd1", "/org/freedesktop/systemd1").
		CallWithContext(ctx, "org.freedesktop.systemd1.Manager.Halt", 0).Err
	if err != nil {
		return fmt.Errorf("halt the node: %w", err)
	}
	return nil
}

// Close closes the connection.
func (n *Node) Close() { n.sd.Close() }
