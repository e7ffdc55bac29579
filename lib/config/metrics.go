package config

import (
	"net"
	"net/netip"
	"strconv"
)

// Metrics configures the watcher's Prometheus endpoint (lib/metrics). It
// is a setting of the agent, not of the node: it is kept out of the
// applied copy and of the Fingerprint (json "-"), so turning metrics on or
// moving the port never looks like a new node configuration (no repave,
// and the bootstrap's admission still recognises the installation). The
// watcher reads it from the operator's file at each start.
type Metrics struct {
	// Listen is host:port, host an IP address or "localhost"; "" (the
	// default) serves no metrics.
	Listen string `toml:"listen" json:"-"`
	// AllowRemote lets Listen name an address other than loopback: the
	// endpoint is plain HTTP without authentication.
	AllowRemote bool `toml:"allow_remote" json:"-"`
}

var pathMetricsListen = []string{"metrics", "listen"}

// metrics checks [metrics]: a port that can be scraped, an address that is
// loopback unless allow_remote says otherwise.
func (v *validator) metrics(m *Metrics) {
	if m.Listen == "" {
		return
	}
	host, port, err := net.SplitHostPort(m.Listen)
	if err != nil {
		v.fail(pathMetricsListen, quote(m.Listen), `want host:port, e.g. "127.0.0.1:9469" (an IPv6 host in brackets: "[::1]:9469")`)
		return
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		v.fail(pathMetricsListen, quote(m.Listen), "port %q: want a number from 1 to 65535", port)
		return
	}
	loopback := host == "localhost"
	if !loopback {
		a, err := netip.ParseAddr(host)
		if err != nil {
			v.fail(pathMetricsListen, quote(m.Listen), `host %q: want an IP address or localhost (every interface is "0.0.0.0" or "[::]", with allow_remote)`, host)
			return
		}
		loopback = a.IsLoopback()
	}
	if !loopback && !m.AllowRemote {
		v.fail(pathMetricsListen, quote(m.Listen), "%s is not a loopback address, and the endpoint has no authentication: set metrics.allow_remote = true to serve it beyond this host", host)
	}
}
