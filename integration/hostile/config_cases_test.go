package hostile

import (
	"net"
	"os"
	"path/filepath"
	"strings"
)

// configEdit is one hostile configuration: a line of the example replaced.
type configEdit struct {
	name, from, to string
	want           []string // besides exit 1
}

// configEdits are values the host would refuse later, or that would make
// it act outside its place; `config check` and the bootstrap's --preflight
// must refuse each, naming the key.
var configEdits = []configEdit{
	{"machine name with a slash", `name = "worker-1"`, `name = "../worker-1"`, []string{"machine.name"}},
	{"machine name with a newline", `name = "worker-1"`, `name = "worker\n1"`, []string{"machine.name"}},
	{"machine name empty", `name = "worker-1"`, `name = ""`, []string{"machine.name"}},
	{"machine name of 300 characters", `name = "worker-1"`, `name = "` + strings.Repeat("w", 300) + `"`, []string{"machine.name"}},
	{"machine name with an escape", `name = "worker-1"`, `name = "worker-1\u001b[2J"`, []string{"machine.name"}},
	{"server plain http", `server = "https://203.0.113.10:6443"`, `server = "http://203.0.113.10:6443"`, []string{"cluster.server"}},
	{"server a file URL", `server = "https://203.0.113.10:6443"`, `server = "file:///etc/shadow"`, []string{"cluster.server"}},
	{"server empty", `server = "https://203.0.113.10:6443"`, `server = ""`, []string{"cluster.server"}},
	{"ca_file relative", `ca_file = "/etc/kubeslot/cluster-ca.crt"`, `ca_file = "etc/kubeslot/cluster-ca.crt"`, []string{"cluster.ca_file"}},
	{"ca_file climbing", `ca_file = "/etc/kubeslot/cluster-ca.crt"`, `ca_file = "/etc/kubeslot/../../../proc/self/environ"`, []string{"cluster.ca_file"}},
	{"ca_file with a NUL", `ca_file = "/etc/kubeslot/cluster-ca.crt"`, `ca_file = "/etc/kubeslot/ca\u0000.crt"`, []string{"cluster.ca_file"}},
	{"token too short", exampleToken, `bootstrap_token = "abcdef.0123"`, []string{"bootstrap_token"}},
	{"token with a newline", exampleToken, `bootstrap_token = "abcdef.0123456789abcdef\nX=1"`, []string{"bootstrap_token"}},
	{"token an integer", exampleToken, `bootstrap_token = 12345`, []string{"bootstrap_token"}},
	{"version not semver", `version = "1.37.2"`, `version = "latest"`, []string{"kubernetes.version"}},
	{"version with a path", `version = "1.37.2"`, `version = "1.37.2/../../x"`, []string{"kubernetes.version"}},
	{"cluster_dns not an IP", `cluster_dns = ["10.96.0.10"]`, `cluster_dns = ["dns.example.com"]`, []string{"kubernetes.cluster_dns"}},
	{"cluster_domain with spaces", `cluster_domain = "cluster.local"`, `cluster_domain = "cluster local"`, []string{"kubernetes.cluster_domain"}},
	{"taint without an effect", `taints = ["dedicated=batch:NoSchedule"]`, `taints = ["dedicated=batch"]`, []string{"kubernetes.taints"}},
	{"label key with a space", `"kubeslot.dev/pool" = "edge"`, `"kubeslot dev/pool" = "edge"`, []string{"kubernetes.labels"}},
	{"label value too long", `"kubeslot.dev/pool" = "edge"`, `"kubeslot.dev/pool" = "` + strings.Repeat("e", 70) + `"`, []string{"kubernetes.labels"}},
	{"rootfs source a file URL", `source = "https://images.example.com/kubeslot/node-rootfs-1.37.2.tar.zst"`, `source = "file:///etc/shadow"`, []string{"rootfs.source"}},
	{"rootfs source relative", `source = "https://images.example.com/kubeslot/node-rootfs-1.37.2.tar.zst"`, `source = "node-rootfs.tar"`, []string{"rootfs.source"}},
	{"rootfs sha256 short", `sha256 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"`, `sha256 = "0123"`, []string{"rootfs.sha256"}},
	{"rootfs sha256 not hex", `sha256 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"`, `sha256 = "` + strings.Repeat("zz", 32) + `"`, []string{"rootfs.sha256"}},
	{"kubelet URL gopher", `url = "https://dl.k8s.io/release/v1.37.2/bin/linux/amd64/kubelet"`, `url = "gopher://dl.k8s.io/kubelet"`, []string{"artifacts.kubelet.url"}},
	{"kubelet sha256 missing", `sha256 = "1111111111111111111111111111111111111111111111111111111111111111"`, `sha256 = ""`, []string{"artifacts.kubelet.sha256"}},
	{"isolation mode unknown", `mode = "nspawn"`, `mode = "chroot"`, []string{"isolation.mode"}},
	{"one slot only", `slots = ["a", "b"]`, `slots = ["a"]`, []string{"isolation.slots"}},
	{"the same slot twice", `slots = ["a", "b"]`, `slots = ["a", "a"]`, []string{"isolation.slots"}},
	{"slot with a slash", `slots = ["a", "b"]`, `slots = ["a", "../b"]`, []string{"isolation.slots"}},
	{"slot named ..", `slots = ["a", "b"]`, `slots = ["a", ".."]`, []string{"isolation.slots"}},
	{"slot with upper case", `slots = ["a", "b"]`, `slots = ["a", "B"]`, []string{"isolation.slots"}},
	{"timeout negative", `download = "10m"`, `download = "-10m"`, []string{"timeouts.download"}},
	{"timeout not a duration", `node_ready = "5m"`, `node_ready = "soon"`, []string{"timeouts.node_ready"}},
	{"timeout of a century", `stop = "90s"`, `stop = "876000h"`, []string{"timeouts.stop"}},
	{"install_packages a string", `install_packages = false`, `install_packages = "yes"`, []string{"host.install_packages"}},
	{"unknown key", `[host]`, "[host]\nrun_as = \"root\"", []string{"host.run_as"}},
	{"unknown section", `[host]`, "[hook]\ncommand = \"rm -rf /\"\n[host]", []string{"hook"}},
	{"cni mode unknown", `mode = "cluster"`, `mode = "host"`, []string{"node.cni.mode"}},
}

// configCases runs each hostile configuration through `config check` and
// the bootstrap's --preflight, and a few file-level ones.
func configCases() []hcase {
	var out []hcase
	for _, c := range configEdits {
		c := c
		out = append(out, hcase{name: "config check " + c.name, bin: "kubeslot", code: 1, want: c.want,
			setup: func(e *env) []string { return []string{"config", "check", e.config(c.from, c.to)} }})
	}
	for _, c := range configEdits[:12] {
		c := c
		out = append(out, hcase{name: "bootstrap preflight " + c.name, bin: "kubeslot-bootstrap", code: 1, want: c.want,
			setup: func(e *env) []string { return []string{"--preflight", "--config", e.config(c.from, c.to)} }})
	}
	out = append(out,
		hcase{name: "config check empty file", bin: "kubeslot", code: 1, want: []string{"cluster.server"},
			setup: func(e *env) []string { return []string{"config", "check", e.file("c.toml", "", 0o600)} }},
		hcase{name: "config check binary garbage", bin: "kubeslot", code: 1, want: []string{"c.toml"},
			setup: func(e *env) []string {
				return []string{"config", "check", e.file("c.toml", "\x00\xff\xfe\x7fELF", 0o600)}
			}},
		hcase{name: "config check TOML bomb of nested tables", bin: "kubeslot", code: 1, want: []string{"c.toml"},
			setup: func(e *env) []string {
				return []string{"config", "check", e.file("c.toml", "x = "+strings.Repeat("[", 100000)+strings.Repeat("]", 100000), 0o600)}
			}},
		hcase{name: "config check file too large", bin: "kubeslot", code: 1, want: []string{"larger than 1048576 bytes"},
			setup: func(e *env) []string {
				return []string{"config", "check", e.file("c.toml", strings.Repeat("# padding\n", 200000), 0o600)}
			}},
		hcase{name: "config check a directory", bin: "kubeslot", code: 1, want: []string{"not a regular file"},
			setup: func(e *env) []string { return []string{"config", "check", e.scratch} }},
		hcase{name: "config check a missing file", bin: "kubeslot", code: 1, want: []string{"no-such.toml"},
			setup: func(e *env) []string { return []string{"config", "check", filepath.Join(e.scratch, "no-such.toml")} }},
		hcase{name: "config check a socket", bin: "kubeslot", code: 1, want: []string{"not a regular file"},
			setup: func(e *env) []string {
				p := filepath.Join(e.scratch, "c.sock")
				listenUnix(e, p)
				return []string{"config", "check", p}
			}},
		hcase{name: "config check a link to the token file", bin: "kubeslot", code: 0,
			setup: func(e *env) []string {
				p := e.config()
				l := filepath.Join(e.scratch, "link.toml")
				os.Symlink(p, l)
				return []string{"config", "check", l}
			}},
		hcase{name: "config check a duplicate key", bin: "kubeslot", code: 1, want: []string{"name"},
			setup: func(e *env) []string {
				return []string{"config", "check", e.config(`name = "worker-1"`, "name = \"worker-1\"\nname = \"worker-2\"")}
			}},
		hcase{name: "bootstrap preflight world-readable token", bin: "kubeslot-bootstrap", code: 1, want: []string{"readable by others", "hostprep: root prefix"},
			environ: []string{"KUBESLOT_SKIP_SANDBOX_IMAGE_CHECK=1"},
			setup: func(e *env) []string {
				p := e.config()
				os.Chmod(p, 0o644)
				return []string{"--preflight", "--config", p}
			}},
	)
	return out
}

// listenUnix leaves a listening socket at p for the case's lifetime.
func listenUnix(e *env, p string) {
	e.t.Helper()
	l, err := net.Listen("unix", p)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { l.Close() })
}
