package kube

// Cluster egress (Options.ClusterEgress): kube-apiserver reaches kubelets (logs, exec, attach, port-forward, node
// proxy) at a Node's InternalIP, which for a node in an sdhost NodeNetwork host exists only inside that host's network
// namespace. The apiserver's egress selector sends its "cluster" traffic to an HTTP CONNECT proxy on a Unix socket
// in the control plane's dir; the test process serves it (netfwd.ConnectProxy) and dials each requested host:port
// inside the namespace RouteEgress named for it. Loopback targets (webhooks served by the test) are dialed in the
// machine's namespace; anything else is refused with 403, so apiserver traffic never leaves this machine.
//
// The configuration file (schema: k8s.io/apiserver/pkg/apis/apiserver/v1beta1, EgressSelectorConfiguration):
//
//	apiVersion: apiserver.k8s.io/v1beta1
//	kind: EgressSelectorConfiguration
//	egressSelections:
//	- name: cluster
//	  connection:
//	    proxyProtocol: HTTPConnect
//	    transport:
//	      uds:
//	        udsName: <dir>/egress.sock

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/kubeslot/kubeslot/integration/netfwd"
)

const (
	egressSocketFile = "egress.sock"
	egressConfigFile = "egress-selector.yaml"
)

// egress is the control plane's CONNECT proxy and its routes.
type egress struct {
	sock, config string
	proxy        *netfwd.ConnectProxy

	mu     sync.Mutex
	routes map[string]*egressRoute // by IP string and by name
}

type egressRoute struct {
	ip    netip.Addr
	netns func() (string, error)
}

// startEgress listens on the Unix socket and writes the egress selector configuration; startAPIServer then passes
// egressArgs.
func (c *ControlPlane) startEgress() error {
	e := &egress{
		sock:   filepath.Join(c.dir, egressSocketFile),
		config: filepath.Join(c.dir, egressConfigFile),
		routes: map[string]*egressRoute{},
	}
	if len(e.sock) >= 108 { // sun_path
		return fmt.Errorf("kube: cluster egress: socket path %s is too long for a Unix socket; use a shorter Options.Dir", e.sock)
	}
	_ = os.Remove(e.sock) // a socket file left by a killed run in a caller-chosen Dir
	cfg := "apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\negressSelections:\n" +
		"- name: cluster\n  connection:\n    proxyProtocol: HTTPConnect\n    transport:\n      uds:\n" +
		"        udsName: " + e.sock + "\n"
	if err := os.WriteFile(e.config, []byte(cfg), 0o600); err != nil {
		return fmt.Errorf("kube: cluster egress: %w", err)
	}
	l, err := net.Listen("unix", e.sock)
	if err != nil {
		return fmt.Errorf("kube: cluster egress: %w", err)
	}
	if err := os.Chmod(e.sock, 0o600); err != nil {
		l.Close()
		return fmt.Errorf("kube: cluster egress: %w", err)
	}
	e.proxy = netfwd.ServeConnect(l, e.route, c.log.With("component", "egress"))
	c.egress = e
	return nil
}

// egressArgs are the kube-apiserver flags cluster egress needs (none without it). InternalIP comes first among the
// address types so the apiserver dials a kubelet at the node IP the rig routes, not at its hostname.
func (c *ControlPlane) egressArgs() []string {
	if c.egress == nil {
		return nil
	}
	return []string{
		"--egress-selector-config-file=" + c.egress.config,
		"--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname",
	}
}

// closeEgress stops the proxy (after the apiserver is gone).
func (c *ControlPlane) closeEgress() error {
	if c.egress == nil {
		return nil
	}
	err := c.egress.proxy.Close()
	if rerr := os.Remove(c.egress.sock); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	return err
}

// RouteEgress makes the apiserver's cluster traffic to ip (and to any of names, as a Node's Hostname address would
// be dialed) go to ip inside the network namespace netns returns, asked afresh for each connection (a host that
// reboots has a new namespace; sdhost.Host.NetNS fits). remove undoes it. It fails without Options.ClusterEgress or
// when ip or a name is routed already.
func (c *ControlPlane) RouteEgress(ip netip.Addr, netns func() (string, error), names ...string) (remove func(), err error) {
	if c.egress == nil {
		return nil, errors.New("kube: RouteEgress needs Options.ClusterEgress")
	}
	if !ip.IsValid() || netns == nil {
		return nil, errors.New("kube: RouteEgress: want an IP address and a netns func")
	}
	e := c.egress
	r := &egressRoute{ip: ip.Unmap(), netns: netns}
	keys := append([]string{r.ip.String()}, names...)
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, k := range keys {
		if _, ok := e.routes[strings.ToLower(k)]; ok {
			return nil, fmt.Errorf("kube: RouteEgress: %s is routed already", k)
		}
	}
	for _, k := range keys {
		e.routes[strings.ToLower(k)] = r
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			e.mu.Lock()
			defer e.mu.Unlock()
			for _, k := range keys {
				if e.routes[strings.ToLower(k)] == r {
					delete(e.routes, strings.ToLower(k))
				}
			}
		})
	}, nil
}

// route is the proxy's netfwd.Route.
func (e *egress) route(host string) (string, string, error) {
	key := strings.ToLower(strings.TrimSuffix(host, "."))
	if a, err := netip.ParseAddr(host); err == nil {
		key = a.Unmap().String()
	}
	e.mu.Lock()
	r := e.routes[key]
	e.mu.Unlock()
	if r != nil {
		ns, err := r.netns()
		if err != nil {
			return "", "", fmt.Errorf("%s: %w", host, err)
		}
		return ns, r.ip.String(), nil
	}
	if a, err := netip.ParseAddr(key); err == nil && a.IsLoopback() {
		return "", a.String(), nil
	}
	if key == "localhost" {
		return "", "127.0.0.1", nil
	}
	return "", "", fmt.Errorf("%s: %w (kube.ControlPlane.RouteEgress names the rig's nodes)", host, netfwd.ErrNoRoute)
}
