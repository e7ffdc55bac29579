// Package netfwd moves TCP connections between the test process's network namespace (the machine's) and the private
// network namespaces of the rig's isolated hosts, without giving either namespace a route to the other: sockets are
// created inside a host's namespace by a thread that enters it for the duration of one socket call (setns), and the
// test process copies bytes between the two sides. Nothing here adds an address, link, route or firewall rule
// anywhere; all traffic stays on this machine.
//
//   - Listen / Dial: a TCP listener or connection whose socket lives in another network namespace.
//   - Forward: a listener inside a host's namespace whose connections are proxied to an address dialed in the
//     machine's namespace (the apiserver on 127.0.0.1, a loopback registry, the artifact mirror).
//   - ConnectProxy: an HTTP CONNECT proxy (kube-apiserver's egress selector speaks it over a Unix socket) that dials
//     each requested host:port inside the namespace a route names (a node's IP → its host's namespace).
//
// A namespace is named by the path of its nsfs file, "/proc/<pid>/ns/net" for a host (sdhost.Host.NetNS); "" is the
// test process's own. A socket keeps the namespace it was created in for its whole life, so a listener made before
// a host reboots still sits in the dead boot's namespace: make forwarders again after sdhost.Host.Boot.
//
// Only test code (integration/...) may import this package; entering another namespace needs CAP_SYS_ADMIN.
package netfwd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Do runs fn on an OS thread that is inside the network namespace nsPath ("" runs fn right here) and returns fn's
// error. Sockets fn creates stay in that namespace after Do returns. fn must not start goroutines that create
// sockets: they may run on other threads, in the test process's namespace.
//
// The thread is entered into nsPath only for fn's duration. If it cannot be moved back, it is never unlocked, so the
// Go runtime ends it when its goroutine exits instead of reusing a thread in the wrong namespace.
func Do(nsPath string, fn func() error) error {
	if nsPath == "" {
		return fn()
	}
	target, err := os.Open(nsPath)
	if err != nil {
		return fmt.Errorf("netfwd: network namespace: %w", err)
	}
	defer target.Close()
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(target.Fd()), &st); err != nil || st.Type != unix.NSFS_MAGIC {
		return fmt.Errorf("netfwd: %s is not a namespace file (statfs: %v)", nsPath, err)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netfwd: own network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netfwd: enter %s: %w", nsPath, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			// Stay locked: the thread dies with this goroutine rather than serving others in nsPath.
			errc <- errors.Join(ferr, fmt.Errorf("netfwd: leave %s: %w (thread retired)", nsPath, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Listen is net.Listen with the socket created inside the network namespace nsPath. addr must be numeric
// (no name lookups happen inside the namespace).
func Listen(nsPath, network, addr string) (net.Listener, error) {
	if err := numeric(addr); err != nil {
		return nil, err
	}
	var l net.Listener
	err := Do(nsPath, func() (err error) {
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// Dial is net.Dialer.DialContext with the socket created inside the network namespace nsPath. addr must be
// numeric: a single address means one socket, created on the calling thread.
func Dial(ctx context.Context, nsPath, network, addr string) (net.Conn, error) {
	if err := numeric(addr); err != nil {
		return nil, err
	}
	var c net.Conn
	err := Do(nsPath, func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

func numeric(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("netfwd: %w", err)
	}
	if host != "" && net.ParseIP(host) == nil {
		return fmt.Errorf("netfwd: %q: want a numeric IP address", addr)
	}
	return nil
}

// SameNamespace reports whether two nsfs paths name the same namespace ("" is the test process's own).
func SameNamespace(a, b string) (bool, error) {
	ids := [2][2]uint64{}
	for i, p := range []string{a, b} {
		if p == "" {
			p = "/proc/self/ns/net"
		}
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return false, fmt.Errorf("netfwd: %s: %w", p, err)
		}
		ids[i] = [2]uint64{st.Dev, st.Ino}
	}
	return ids[0] == ids[1], nil
}
