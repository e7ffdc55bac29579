package sdhost

// The node network (Options.NodeNetwork): a host with its own network namespace gets, at every boot, an address a
// kubelet can use as --node-ip and listen on. The kernels here have no dummy driver, so the link is one end of a veth
// pair whose other end stays in the same namespace, up and without an address: the pair has carrier, and anything
// sent to it goes nowhere. Everything is made inside the host's namespace (nsenter on a pinned namespace file, after
// checking it is not the test process's own), so the machine's namespace never gets an address, link or route; the
// namespace and all of it vanish with the host's PID 1. Connections between the host and the machine go through
// integration/netfwd (listeners and dials made inside the namespace), never through a route.
//
//	lo          127.0.0.1/8, up
//	rig0        NodeIP/24, up            (NodeLink)
//	rig0-peer   up, no address
//	default via <NodeIP's .1> dev rig0 onlink   (a gateway that does not exist: packets are dropped, on this machine)

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// NodeLink is the name of the link that carries a node-network host's NodeIP.
const NodeLink = "rig0"

// nodeIPs hands out 10.213.<n>.2 to node-network hosts of this process, n in 1..250; addresses only ever exist in
// the hosts' own namespaces, so other test processes may use the same ones.
var nodeIPs struct {
	mu    sync.Mutex
	inUse map[netip.Addr]string // address -> host name
}

// NodeIPPrefix is the range NodeIP is chosen from when Options.NodeIP is not set.
var NodeIPPrefix = netip.MustParsePrefix("10.213.0.0/16")

// claimNodeIP picks (or records the explicitly asked) node IP of a NodeNetwork host; a no-op otherwise.
func (h *Host) claimNodeIP() error {
	if !h.opts.NodeNetwork {
		return nil
	}
	nodeIPs.mu.Lock()
	defer nodeIPs.mu.Unlock()
	if nodeIPs.inUse == nil {
		nodeIPs.inUse = map[netip.Addr]string{}
	}
	if h.nodeIP.IsValid() { // already claimed (Start after a failed Start is not possible; Boot does not claim)
		return nil
	}
	ip := h.opts.NodeIP
	if ip.IsValid() {
		if other, ok := nodeIPs.inUse[ip]; ok {
			return fmt.Errorf("sdhost: host %s: NodeIP %s is already host %s's", h.opts.Name, ip, other)
		}
	} else {
		for n := 1; n <= 250 && !ip.IsValid(); n++ {
			cand := netip.AddrFrom4([4]byte{10, 213, byte(n), 2})
			if _, ok := nodeIPs.inUse[cand]; !ok {
				ip = cand
			}
		}
		if !ip.IsValid() {
			return fmt.Errorf("sdhost: host %s: all 250 node IPs of this process are in use", h.opts.Name)
		}
	}
	nodeIPs.inUse[ip] = h.opts.Name
	h.nodeIP = ip
	return nil
}

func (h *Host) releaseNodeIP() {
	nodeIPs.mu.Lock()
	defer nodeIPs.mu.Unlock()
	if h.nodeIP.IsValid() && nodeIPs.inUse[h.nodeIP] == h.opts.Name {
		delete(nodeIPs.inUse, h.nodeIP)
	}
}

// checkNodeNetwork validates the NodeNetwork options (called by newHost).
func checkNodeNetwork(o Options) error {
	if o.NodeIP.IsValid() && !o.NodeNetwork {
		return fmt.Errorf("sdhost: host %s: NodeIP without NodeNetwork", o.Name)
	}
	if !o.NodeNetwork {
		return nil
	}
	if o.SharedNetwork {
		return fmt.Errorf("sdhost: host %s: NodeNetwork needs the host's own network namespace, not SharedNetwork", o.Name)
	}
	if ip := o.NodeIP; ip.IsValid() && (!ip.Is4() || !ip.IsPrivate() || ip.As4()[3] == 1 || ip.As4()[3] == 0 || ip.As4()[3] == 255) {
		return fmt.Errorf("sdhost: host %s: NodeIP %s: want a private IPv4 address whose last byte is not 0, 1 or 255", o.Name, ip)
	}
	return nil
}

// NodeIP is the host's node address (see Options.NodeNetwork); the zero Addr when the host has none.
func (h *Host) NodeIP() netip.Addr { return h.nodeIP }

// NetNS is "/proc/<pid>/ns/net", the host's network namespace as integration/netfwd names it, or an error when the
// host is not running. Each boot has a new namespace: listeners made in the last one are gone with it.
func (h *Host) NetNS() (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.inst == nil || h.inst.exited() {
		return "", fmt.Errorf("sdhost: host %s is not running", h.opts.Name)
	}
	return fmt.Sprintf("/proc/%d/ns/net", h.inst.pid), nil
}

// setupNodeNetwork configures the new boot's network namespace; a no-op without NodeNetwork. It runs right after
// spawn, while host-init prepares the root, so systemd starts with the network already there.
func (h *Host) setupNodeNetwork(inst *instance) error {
	if !h.opts.NodeNetwork {
		return nil
	}
	t0 := time.Now()
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", inst.pid))
	if err != nil {
		return fmt.Errorf("host %s: node network: %w", h.opts.Name, err)
	}
	defer ns.Close()
	// The file was opened by PID, so make sure that PID was still our PID 1 then: the pidfd cannot be recycled.
	if err := inst.proc.Signal(syscall.Signal(0)); err != nil {
		return fmt.Errorf("host %s: node network: PID 1 (%d) gone: %w", h.opts.Name, inst.pid, err)
	}
	if same, err := sameNetNS(ns, "/proc/self/ns/net"); err != nil || same {
		// Never configure the machine's own namespace: that is what SharedNetwork hosts are in.
		return fmt.Errorf("host %s: node network: refusing to configure pid %d's network namespace (machine's own: %v, %v)",
			h.opts.Name, inst.pid, same, err)
	}
	nsenter, err := lookPath("nsenter")
	if err != nil {
		return err
	}
	ip := h.nodeIP
	gw := netip.AddrFrom4([4]byte{ip.As4()[0], ip.As4()[1], ip.As4()[2], 1})
	batch := strings.Join([]string{
		"link set lo up",
		"link add " + NodeLink + " type veth peer name " + NodeLink + "-peer",
		"link set " + NodeLink + "-peer up",
		"addr add " + netip.PrefixFrom(ip, 24).String() + " dev " + NodeLink,
		"link set " + NodeLink + " up",
		"route add default via " + gw.String() + " dev " + NodeLink + " onlink",
	}, "\n") + "\n"
	// fd 3 in nsenter is the pinned namespace file: nothing can swap the namespace between check and use.
	cmd := exec.Command(nsenter, "--net=/proc/self/fd/3", "--", "ip", "-batch", "-")
	cmd.ExtraFiles = []*os.File{ns}
	cmd.Stdin = strings.NewReader(batch)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("host %s: node network: ip -batch in pid %d's namespace: %v: %s", h.opts.Name, inst.pid, err, out)
	}
	h.log.Debug("node network up", "ip", ip, "link", NodeLink, "took", time.Since(t0).Round(time.Millisecond))
	return nil
}

// sameNetNS reports whether the namespace file f and the nsfs file at path are the same namespace.
func sameNetNS(f *os.File, path string) (bool, error) {
	a, err := f.Stat()
	if err != nil {
		return false, err
	}
	b, err := os.Stat(path)
	if err != nil {
		return false, err
	}
	sa, ok1 := a.Sys().(*syscall.Stat_t)
	sb, ok2 := b.Sys().(*syscall.Stat_t)
	if !ok1 || !ok2 {
		return false, errors.New("no stat_t")
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino, nil
}

// SetNodeIP gives a NodeNetwork host another node address from its next Boot on, as a DHCP server might hand a real
// host a new lease across a reboot; the host must be powered off (or killed). The address is checked and claimed as
// Options.NodeIP is; the old one is released. Nothing outside the host's own namespace changes.
func (h *Host) SetNodeIP(ip netip.Addr) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped || (h.inst != nil && !h.inst.exited()) {
		return fmt.Errorf("sdhost: host %s: SetNodeIP needs a powered-off host", h.opts.Name)
	}
	o := h.opts
	o.NodeIP = ip
	if err := checkNodeNetwork(o); err != nil {
		return err
	}
	if !ip.IsValid() {
		return fmt.Errorf("sdhost: host %s: SetNodeIP: want an address", h.opts.Name)
	}
	nodeIPs.mu.Lock()
	defer nodeIPs.mu.Unlock()
	if other, ok := nodeIPs.inUse[ip]; ok && other != h.opts.Name {
		return fmt.Errorf("sdhost: host %s: NodeIP %s is already host %s's", h.opts.Name, ip, other)
	}
	if nodeIPs.inUse[h.nodeIP] == h.opts.Name {
		delete(nodeIPs.inUse, h.nodeIP)
	}
	nodeIPs.inUse[ip] = h.opts.Name
	h.nodeIP, h.opts.NodeIP = ip, ip
	return nil
}

// OnNetwork has every later Boot call f with the new boot's network namespace ("/proc/<pid>/ns/net") as soon as the
// node network is up, before systemd has finished booting: a test can make its forwarders there while units that
// need them start, as a real host's network is there at boot. f must not call the Host's methods (Boot holds the
// host's lock); nil removes it.
func (h *Host) OnNetwork(f func(netns string)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.onNetwork = f
}
