package watcher

// The post-start check of the node's address: the Node's InternalIP, as its kubelet reports it,
// must be an address the host has now and the one the pre-start hook gave the kubelet at this node start. The
// watcher looks at every decision (each Node status update wakes it), so a node started before the host's address
// changed (a DHCP lease renewed to another address while it runs) is reported too: Degraded, reason
// NodeAddressMismatch, with both addresses, until a node restart gives the kubelet the new one.

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/kubeslot/kubeslot/lib/isolation"
)

// ReasonNodeAddress is the Degraded reason of a Node whose address is not the host's.
const ReasonNodeAddress = "NodeAddressMismatch"

// hostAddrs lists the host's interface addresses; tests replace it.
var hostAddrs = func() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}

// nodeAddrProblem says what is wrong with the Node's InternalIPs for this host ("" nothing, or nothing to check:
// no hook record for the active slot, no address reported yet, the host's addresses unreadable).
func nodeAddrProblem(rec isolation.HookRecord, found bool, activeSlot string, internal []string) string {
	if !found || rec.Slot != activeSlot || len(internal) == 0 {
		return ""
	}
	host, err := hostAddrs()
	if err != nil {
		return ""
	}
	var problems []string
	for _, s := range internal {
		a, err := netip.ParseAddr(s)
		if err != nil {
			problems = append(problems, fmt.Sprintf("the Node reports InternalIP %q, not an address", s))
			continue
		}
		if !slices.Contains(host, a.Unmap()) {
			problems = append(problems, fmt.Sprintf("the Node reports InternalIP %s, which this host no longer has (it has %s): restart the node (NodeRestart) to give the kubelet the current one", s, hostList(host)))
		} else if rec.NodeIP != "" && s != rec.NodeIP {
			problems = append(problems, fmt.Sprintf("the Node reports InternalIP %s, the pre-start hook gave the kubelet %s", s, rec.NodeIP))
		}
	}
	return strings.Join(problems, "; ")
}

// hostList is the host's addresses without loopback and link-local ones, for messages.
func hostList(addrs []netip.Addr) string {
	var s []string
	for _, a := range addrs {
		if !a.IsLoopback() && !a.IsLinkLocalUnicast() {
			s = append(s, a.String())
		}
	}
	if len(s) == 0 {
		return "none but loopback"
	}
	return strings.Join(s, ", ")
}

// internalIPs are a Node's InternalIP addresses.
func internalIPs(n *coreNode) []string {
	var out []string
	for _, a := range n.Status.Addresses {
		if a.Type == "InternalIP" {
			out = append(out, a.Address)
		}
	}
	return out
}

// checkNodeAddr sets in.NodeAddrErr from the cached Node, logging a new finding once.
func (l *loop) checkNodeAddr(in *Inputs, node any) {
	n, ok := node.(*coreNode)
	if !ok || in.Applied == nil {
		return
	}
	rec, found, err := isolation.LoadHookRecord(l.Root)
	if err != nil {
		l.Log.Warn("the pre-start hook's record is unreadable: the node's address is not checked", "err", err.Error())
	}
	in.NodeAddrErr = nodeAddrProblem(rec, found, in.Applied.Slot, internalIPs(n))
	if in.NodeAddrErr != l.lastAddrErr && in.NodeAddrErr != "" {
		l.Log.Warn("the node's address is not the host's", "problem", in.NodeAddrErr)
	}
	l.lastAddrErr = in.NodeAddrErr
}
