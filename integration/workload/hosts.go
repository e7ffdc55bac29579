package workload

import (
	"fmt"
	"path/filepath"
	"strings"
)

// HostsTOML is the containerd hosts.toml that makes mirrorURL (a plain-HTTP
// registry such as Registry.MirrorURL(), "http://127.0.0.1:<port>") the
// first place containerd pulls and resolves upstream's images from, with
// "https://<upstream>" as the fallback. upstream is the registry host of the
// image references the pods use, e.g. "registry.kubeslot.test" or
// "registry.kubeslot.test:5000"; it need not exist.
//
// Where containerd looks for it (checked against the source of containerd
// 1.6.20, Debian bookworm's package: remotes/docker/config/hosts.go). The CRI
// plugin reads hosts files only when config.toml (version = 2) names their
// root:
//
//	[plugins."io.containerd.grpc.v1.cri".registry]
//	  config_path = "/etc/containerd/certs.d"
//
// and it then refuses to load if the deprecated registry.mirrors table is
// set as well ("`mirrors` cannot be set when `config_path` is provided").
// `ctr images pull --hosts-dir DIR` reads the same layout. Further:
//
//   - For an image on registry host H, containerd takes the first existing
//     directory of <config_path>/<H with ":port" as "_port_"> (only when H
//     has a port), <config_path>/<H>, <config_path>/_default, and reads
//     hosts.toml there (HostsTOMLPath gives <config_path>/<H>/hosts.toml).
//     Changes are picked up on the next pull; no restart is needed.
//   - The keys 1.6 knows: top-level server, one [host."<scheme>://<host>"]
//     table per mirror (tried in file order, before server), and per host
//     (or at top level, for server): capabilities ("pull", "resolve",
//     "push"; all three when absent), ca, client, skip_verify, header,
//     override_path. Newer keys (dial_timeout, proxy) do not exist in 1.6.
//   - A host URL's scheme is used as written, so "http://" means plain HTTP
//     with no TLS at all; a server without a scheme gets "https://". The
//     path defaults to "/v2".
//   - Requests to a host other than the image's registry host carry
//     "?ns=<registry host>"; the Registry here ignores query strings.
//
// Where no hosts file matches, 1.6's hosts code (ConfigureHosts) already
// pulls a reference whose registry host is "localhost" or a loopback IP
// ("127.0.0.1:<port>/workload:v1") over plain HTTP, so a mirror is only
// needed when the pods name another host.
// 127.0.0.1 in a hosts file means the loopback of the network namespace
// containerd runs in.
func HostsTOML(upstream, mirrorURL string) string {
	server := upstream
	if !strings.Contains(server, "://") {
		server = "https://" + server
	}
	return fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n",
		server, strings.TrimSuffix(mirrorURL, "/"))
}

// HostsTOMLPath is where HostsTOML's output for upstream goes under
// containerd's config_path (e.g. "/etc/containerd/certs.d"):
// <configPath>/<upstream>/hosts.toml.
func HostsTOMLPath(configPath, upstream string) string {
	return filepath.Join(configPath, upstream, "hosts.toml")
}
