package config

import (
	"encoding/pem"
	"fmt"
	"strings"
	"testing"
)

// want is one expected Error.
type want struct {
	key   string // Error.Key, exactly
	value string // Error.Value, exactly
	msg   string // a substring of Error.Msg
	at    string // text on the line the error must name; "" if Line must be 0
}

// errorCase is a document and the errors Parse must report for it, in
// order: by line, missing keys (line 0) last.
type errorCase struct {
	name string
	doc  string
	want []want
}

func runErrorCases(t *testing.T, cases []errorCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			errs := parseErrors(t, c.doc)
			if len(errs) != len(c.want) {
				t.Fatalf("got %d errors, want %d:\n%v\ndocument:\n%s", len(errs), len(c.want), errs, c.doc)
			}
			for i, w := range c.want {
				checkError(t, c.doc, errs[i], w)
			}
		})
	}
}

func checkError(t *testing.T, doc string, e *Error, w want) {
	t.Helper()
	line := 0
	if w.at != "" {
		line = lineOf(t, doc, w.at)
	}
	if e.Key != w.key || e.Value != w.value || e.Line != line || !strings.Contains(e.Msg, w.msg) || e.File != "test.toml" {
		t.Errorf("got  %#v\nwant key %q value %q line %d msg containing %q", e, w.key, w.value, line, w.msg)
	}
	// The one-line form names file, line, key and value.
	prefix := "test.toml: "
	if line > 0 {
		prefix = fmt.Sprintf("test.toml:%d: ", line)
	}
	if w.key != "" {
		prefix += w.key
		if w.value != "" {
			prefix += " = " + w.value
		}
		prefix += ": "
	}
	if s := e.Error(); !strings.HasPrefix(s, prefix) || !strings.Contains(s, w.msg) {
		t.Errorf("Error() = %q, want prefix %q and %q", s, prefix, w.msg)
	}
}

func TestMalformedTOML(t *testing.T) {
	runErrorCases(t, []errorCase{
		{"unterminated string", with(minimal, "machine", `name = "worker-1`),
			[]want{{"", "", "basic strings cannot have new lines (column", `name = "worker-1`}}},
		{"missing value", with(minimal, "kubernetes", `version =`),
			[]want{{"", "", "(column", `version =`}}},
		{"bare word value", with(minimal, "isolation", `mode = nspawn`),
			[]want{{"", "", "(column 8); strings need quotes", `mode = nspawn`}}},
		{"duplicate key", strings.Replace(minimal, `name = "worker-1"`, "name = \"worker-1\"\nname = \"w2\"", 1),
			[]want{{"name", "", "already defined", `name = "w2"`}}},
	})
}

func TestUnknownKeys(t *testing.T) {
	top := "the top level accepts: machine, cluster, kubernetes, rootfs, artifacts, isolation, timeouts, host"
	runErrorCases(t, []errorCase{
		{"top-level key", "foo = 1\n" + minimal,
			[]want{{"foo", "", "unknown key; " + top, "foo = 1"}}},
		{"top-level table", minimal + "\n[extras]\nx = 1\n",
			[]want{{"extras", "", "unknown table; " + top, "[extras]"}}},
		{"nested, every one reported", with(with(with(minimal, "machine", `nmae = "w"`), "artifacts.kubelet", `urll = "x"`), "timeouts", `donwload = "5m"`),
			[]want{
				{"machine.nmae", "", "unknown key; [machine] accepts: name, node_name", `nmae = "w"`},
				{"artifacts.kubelet.urll", "", "unknown key; [artifacts.kubelet] accepts: url, sha256", `urll = "x"`},
				{"timeouts.donwload", "", "unknown key; [timeouts] accepts: download, node_ready, lock, stop", `donwload = "5m"`},
			}},
		{"unknown nested table", minimal + "\n[artifacts.crio]\nurl = \"/x\"\n",
			[]want{{"artifacts.crio", "", "unknown table; [artifacts] accepts: kubelet, containerd, runc, cni_plugins", "[artifacts.crio]"}}},
		{"typo shows next to the missing key", with(without(minimal, "kubernetes", "version"), "kubernetes", `verison = "1.37.2"`),
			[]want{
				{"kubernetes.verison", "", "unknown key", `verison = "1.37.2"`},
				{"kubernetes.version", "", "missing (required)", ""},
			}},
	})
}

func TestWrongTypes(t *testing.T) {
	runErrorCases(t, []errorCase{
		{"string for array", with(minimal, "isolation", `slots = "a"`),
			[]want{{"isolation.slots", `"a"`, "wrong type: got a TOML string, want an array of strings", `slots = "a"`}}},
		{"integer for string", with(minimal, "machine", `name = 5`),
			[]want{{"machine.name", "5", "wrong type: got a TOML integer, want a string", `name = 5`}}},
		{"integer in string array", with(minimal, "isolation", `slots = ["a", 1]`),
			[]want{{"isolation.slots", `["a", 1]`, "wrong type: got a TOML integer", `slots = ["a", 1]`}}},
		{"string for bool", with(minimal, "host", `install_packages = "yes"`),
			[]want{{"host.install_packages", `"yes"`, "want true or false", `install_packages = "yes"`}}},
		{"integer for duration", with(minimal, "timeouts", `download = 5`),
			[]want{{"timeouts.download", "5", `wrong type: got a TOML integer, want a duration string like "5m"`, `download = 5`}}},
		{"bad duration", with(minimal, "timeouts", `download = "5x"`),
			[]want{{"timeouts.download", `"5x"`, `invalid duration: want a number with a unit, e.g. "90s"`, `download = "5x"`}}},
		{"integer for labels", with(minimal, "kubernetes", `labels = 3`),
			[]want{{"kubernetes.labels", "3", "want a table of strings", `labels = 3`}}},
		{"integer label value", with(minimal, "kubernetes.labels", `"example.com/zone" = 3`),
			[]want{{`kubernetes.labels."example.com/zone"`, "3", "want a string", `"example.com/zone" = 3`}}},
		{"table for string", minimal + "\n[isolation.mode]\nx = 1\n",
			[]want{{"isolation.mode", "", "wrong type: got a table, want a string", "[isolation.mode]"}}},
		{"token of the wrong type is not shown", with(minimal, "cluster", `bootstrap_token = ["`+testToken+`"]`),
			[]want{{"cluster.bootstrap_token", "[redacted]", "want a string", `bootstrap_token = [`}}},
	})
}

func TestMissingRequired(t *testing.T) {
	type key struct{ table, key, want, msg string }
	for _, k := range []key{
		{"cluster", "server", "cluster.server", "missing (required)"},
		{"cluster", "ca_file", "cluster.ca_file", "missing: set ca_file (a path) or ca_pem (inline PEM), exactly one"},
		{"kubernetes", "version", "kubernetes.version", "missing (required)"},
		{"rootfs", "source", "rootfs.source", "missing (required)"},
		{"rootfs", "sha256", "rootfs.sha256", "missing (required)"},
		{"artifacts.kubelet", "url", "artifacts.kubelet.url", "missing (required)"},
		{"artifacts.kubelet", "sha256", "artifacts.kubelet.sha256", "missing (required)"},
	} {
		runErrorCases(t, []errorCase{
			{"without " + k.want, without(minimal, k.table, k.key), []want{{k.want, "", k.msg, ""}}},
			{"empty " + k.want, with(minimal, k.table, k.key+` = ""`),
				[]want{{k.want, `""`, "must not be empty", k.key + ` = ""`}}},
		})
	}
	runErrorCases(t, []errorCase{
		{"empty file", "", []want{ // machine.name may be missing: the host's name
			{"cluster.server", "", "missing", ""},
			{"cluster.ca_file", "", "missing", ""},
			{"kubernetes.version", "", "missing", ""},
			{"rootfs.source", "", "missing", ""},
			{"rootfs.sha256", "", "missing", ""},
			{"artifacts.kubelet.url", "", "missing", ""},
			{"artifacts.kubelet.sha256", "", "missing", ""},
		}},
		{"optional artifact without url", with(minimal, "artifacts.runc", `sha256 = "`+strings.Repeat("ab", 32)+`"`),
			[]want{{"artifacts.runc.url", "", "missing (required)", ""}}},
	})
}

func TestInvalidValues(t *testing.T) {
	sha := strings.Repeat("ab", 32)
	runErrorCases(t, []errorCase{
		// machine
		{"machine name", with(minimal, "machine", `name = "Worker_1"`),
			[]want{{"machine.name", `"Worker_1"`, "must be a DNS-1123 label", `name = "Worker_1"`}}},
		{"machine name too long", with(minimal, "machine", `name = "`+strings.Repeat("a", 64)+`"`),
			[]want{{"machine.name", `"` + strings.Repeat("a", 64) + `"`, "at most 63", `name = "aaa`}}},
		{"node name", with(minimal, "machine", `node_name = "-bad.example"`),
			[]want{{"machine.node_name", `"-bad.example"`, "DNS-1123 subdomain", `node_name =`}}},

		// cluster
		{"server scheme", with(minimal, "cluster", `server = "ftp://x"`),
			[]want{{"cluster.server", `"ftp://x"`, "must be an https URL with a host", `server = "ftp://x"`}}},
		{"server without host", with(minimal, "cluster", `server = "https:///api"`),
			[]want{{"cluster.server", `"https:///api"`, "must be an https URL with a host", `server =`}}},
		{"server without scheme", with(minimal, "cluster", `server = "203.0.113.10:6443"`),
			[]want{{"cluster.server", `"203.0.113.10:6443"`, "must be an https URL", `server =`}}},
		{"server with credentials, not shown", with(minimal, "cluster", `server = "https://admin:hunter2@203.0.113.10:6443"`),
			[]want{{"cluster.server", `"https://[redacted]@203.0.113.10:6443"`, "must not contain credentials", `server =`}}},
		{"CA both", with(minimal, "cluster", `ca_pem = "x"`),
			[]want{{"cluster.ca_pem", "", "conflicts with cluster.ca_file", `ca_pem = "x"`}}},
		{"CA relative path", with(minimal, "cluster", `ca_file = "ca.crt"`),
			[]want{{"cluster.ca_file", `"ca.crt"`, "must be an absolute path", `ca_file = "ca.crt"`}}},
		{"CA PEM garbage", with(without(minimal, "cluster", "ca_file"), "cluster", `ca_pem = "not a certificate"`),
			[]want{{"cluster.ca_pem", "", "at least one PEM certificate", `ca_pem =`}}},
		{"CA PEM is a private key, not shown", with(without(minimal, "cluster", "ca_file"), "cluster", `ca_pem = """`+"\n"+fakePEM("PRIVATE KEY")+`"""`),
			[]want{{"cluster.ca_pem", "", "contains a PRIVATE KEY block", `ca_pem =`}}},
		{"CA PEM certificate does not parse", with(without(minimal, "cluster", "ca_file"), "cluster", `ca_pem = """`+"\n"+fakePEM("CERTIFICATE")+`"""`),
			[]want{{"cluster.ca_pem", "", "certificate 1 does not parse", `ca_pem =`}}},
		{"token and kubeconfig", with(minimal, "cluster", `kubeconfig = "/etc/kubeslot/join.kubeconfig"`),
			[]want{{"cluster.kubeconfig", "", "conflicts with cluster.bootstrap_token", `kubeconfig =`}}},
		{"kubeconfig relative", with(without(minimal, "cluster", "bootstrap_token"), "cluster", `kubeconfig = "join.kubeconfig"`),
			[]want{{"cluster.kubeconfig", `"join.kubeconfig"`, "must be an absolute path", `kubeconfig =`}}},
		{"token without dot", with(minimal, "cluster", `bootstrap_token = "abcdef0123456789abcdef"`),
			[]want{{"cluster.bootstrap_token", "[redacted]", "<6 characters [a-z0-9]>.<16 characters [a-z0-9]> (there is no '.')", `bootstrap_token =`}}},
		{"token too short", with(minimal, "cluster", `bootstrap_token = "abcdef.0123456789abcde"`),
			[]want{{"cluster.bootstrap_token", "[redacted]", "(6 and 15 characters given)", `bootstrap_token =`}}},
		{"token uppercase", with(minimal, "cluster", `bootstrap_token = "ABCDEF.0123456789abcdef"`),
			[]want{{"cluster.bootstrap_token", "[redacted]", "only lowercase letters and digits", `bootstrap_token =`}}},

		// kubernetes
		{"version two parts", with(minimal, "kubernetes", `version = "1.37"`),
			[]want{{"kubernetes.version", `"1.37"`, "MAJOR.MINOR.PATCH", `version =`}}},
		{"version shown as written", with(minimal, "kubernetes", `version = "v1.37"`),
			[]want{{"kubernetes.version", `"v1.37"`, "MAJOR.MINOR.PATCH", `version =`}}},
		{"version word", with(minimal, "kubernetes", `version = "latest"`),
			[]want{{"kubernetes.version", `"latest"`, "MAJOR.MINOR.PATCH", `version =`}}},
		{"version leading zero", with(minimal, "kubernetes", `version = "1.037.2"`),
			[]want{{"kubernetes.version", `"1.037.2"`, "MAJOR.MINOR.PATCH", `version =`}}},
		{"taint effect", with(minimal, "kubernetes", `taints = ["a=b:NoSchedul"]`),
			[]want{{"kubernetes.taints[0]", `"a=b:NoSchedul"`, `effect "NoSchedul" is not one of NoSchedule, PreferNoSchedule, NoExecute`, `taints =`}}},
		{"taint without effect", with(minimal, "kubernetes", `taints = ["dedicated=batch"]`),
			[]want{{"kubernetes.taints[0]", `"dedicated=batch"`, "the effect is missing", `taints =`}}},
		{"taint key, second element, own line", with(minimal, "kubernetes", "taints = [\n  \"ok:NoSchedule\",\n  \"bad key:NoExecute\",\n]"),
			[]want{{"kubernetes.taints[1]", `"bad key:NoExecute"`, `taint key "bad key"`, `"bad key:NoExecute"`}}},
		{"taint value", with(minimal, "kubernetes", `taints = ["k=a b:NoSchedule"]`),
			[]want{{"kubernetes.taints[0]", `"k=a b:NoSchedule"`, `taint value "a b"`, `taints =`}}},
		{"label key", with(minimal, "kubernetes.labels", `"Bad Key!" = "x"`),
			[]want{{`kubernetes.labels."Bad Key!"`, "", "label key", `"Bad Key!"`}}},
		{"label key prefix", with(minimal, "kubernetes.labels", `"Example.COM/zone" = "x"`),
			[]want{{`kubernetes.labels."Example.COM/zone"`, "", "the prefix before '/' must be a DNS-1123 subdomain", `"Example.COM/zone"`}}},
		{"label value", with(minimal, "kubernetes.labels", `zone = "not ok"`),
			[]want{{"kubernetes.labels.zone", `"not ok"`, "label value must be empty or at most 63", `zone = "not ok"`}}},
		{"label value too long, inline table", with(minimal, "kubernetes", `labels = { zone = "`+strings.Repeat("z", 64)+`" }`),
			[]want{{"kubernetes.labels.zone", `"` + strings.Repeat("z", 64) + `"`, "label value", `labels = {`}}},
		{"cluster DNS", with(minimal, "kubernetes", `cluster_dns = ["10.96.0.10", "10.96.0.300"]`),
			[]want{{"kubernetes.cluster_dns[1]", `"10.96.0.300"`, "must be an IPv4 or IPv6 address", `cluster_dns =`}}},
		{"cluster domain", with(minimal, "kubernetes", `cluster_domain = "Cluster.Local"`),
			[]want{{"kubernetes.cluster_domain", `"Cluster.Local"`, "DNS-1123 subdomain", `cluster_domain =`}}},

		// node.kubelet
		{"kubelet override owned key", with(minimal, "node.kubelet", `config = {maxPods = 42, readOnlyPort = 10255}`),
			[]want{{"node.kubelet.config.readOnlyPort", "10255", "kubeslot owns this key", `config = {`}}},
		{"kubelet override wrong type", with(minimal, "node.kubelet.config", `maxPods = "many"`),
			[]want{{"node.kubelet.config.maxPods", `"many"`, "wrong type: want an integer", `maxPods = "many"`}}},
		{"kubelet override unknown key", with(minimal, "node.kubelet.config", `maxpods = 42`),
			[]want{{"node.kubelet.config.maxpods", "", "did you mean maxPods?", `maxpods = 42`}}},

		// rootfs and artifacts
		{"rootfs relative path", with(minimal, "rootfs", `source = "images/rootfs.tar"`),
			[]want{{"rootfs.source", `"images/rootfs.tar"`, "must be an http(s) URL with a host or an absolute path", `source =`}}},
		{"rootfs sha256 short", with(minimal, "rootfs", `sha256 = "abc"`),
			[]want{{"rootfs.sha256", `"abc"`, "64 hex digits (3 characters given)", `sha256 = "abc"`}}},
		{"rootfs sha256 not hex", with(minimal, "rootfs", `sha256 = "`+strings.Repeat("zz", 32)+`"`),
			[]want{{"rootfs.sha256", `"` + strings.Repeat("zz", 32) + `"`, "64 hex digits", `sha256 = "zz`}}},
		{"artifact ftp URL, query hidden", with(minimal, "artifacts.kubelet", `url = "ftp://files.example.com/kubelet?sig=s3cr3t"`),
			[]want{{"artifacts.kubelet.url", `"ftp://files.example.com/kubelet?[redacted]"`, "must be an http(s) URL", `url = "ftp:`}}},
		{"artifact URL without host", with(minimal, "artifacts.kubelet", `url = "https://"`),
			[]want{{"artifacts.kubelet.url", `"https://"`, "must be an http(s) URL", `url = "https://"`}}},
		{"optional artifact sha256", with(minimal, "artifacts.containerd", `url = "/srv/containerd.tgz"`+"\n"+`sha256 = "`+sha[:63]+`"`),
			[]want{{"artifacts.containerd.sha256", `"` + sha[:63] + `"`, "64 hex digits (63 characters given)", `sha256 = "` + sha[:63]}}},

		// isolation
		{"mode", with(minimal, "isolation", `mode = "docker"`),
			[]want{{"isolation.mode", `"docker"`, "unknown isolation mode; known: nspawn", `mode = "docker"`}}},
		{"slots duplicate", with(minimal, "isolation", `slots = ["a", "a"]`),
			[]want{{"isolation.slots", `["a", "a"]`, "the two slot names must differ", `slots =`}}},
		{"slot name", with(minimal, "isolation", `slots = ["a", "B"]`),
			[]want{{"isolation.slots[1]", `"B"`, "slot name must be 1 to 16 characters", `slots =`}}},
		{"slot name too long", with(minimal, "isolation", `slots = ["a", "abcdefghijklmnopq"]`),
			[]want{{"isolation.slots[1]", `"abcdefghijklmnopq"`, "slot name", `slots =`}}},
		{"three slots", with(minimal, "isolation", `slots = ["a", "b", "c"]`),
			[]want{{"isolation.slots", `["a", "b", "c"]`, "exactly two slot names (3 given)", `slots =`}}},
		{"no slots", with(minimal, "isolation", `slots = []`),
			[]want{{"isolation.slots", "[]", "exactly two slot names", `slots = []`}}},

		// timeouts
		{"zero duration", with(minimal, "timeouts", `lock = "0s"`),
			[]want{{"timeouts.lock", `"0s"`, "must be greater than 0; omit the key for the default (30s)", `lock = "0s"`}}},
		{"negative duration", with(minimal, "timeouts", `stop = "-5m"`),
			[]want{{"timeouts.stop", `"-5m0s"`, "must be greater than 0 and at most 24h0m0s", `stop = "-5m"`}}},
		{"duration too long", with(minimal, "timeouts", `node_ready = "48h"`),
			[]want{{"timeouts.node_ready", `"48h0m0s"`, "at most 24h0m0s", `node_ready = "48h"`}}},

		// Validation goes on after the first problem.
		{"several at once", with(with(with(minimal, "cluster", `server = "ftp://x"`), "kubernetes", `version = "1.37"`), "isolation", `slots = ["a", "a"]`),
			[]want{
				{"cluster.server", `"ftp://x"`, "https URL", `server =`},
				{"kubernetes.version", `"1.37"`, "MAJOR.MINOR.PATCH", `version =`},
				{"isolation.slots", `["a", "a"]`, "must differ", `slots =`},
			}},
	})
}

func fakePEM(typ string) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: []byte("definitely not DER")}))
}

// The one-line forms operators read, exactly.
func TestErrorStrings(t *testing.T) {
	doc := with(without(minimal, "kubernetes", "version"), "cluster", `server = "ftp://x"`)
	_, err := Parse("config.toml", []byte(doc))
	// In file order, missing keys last.
	want := `config.toml:5: cluster.server = "ftp://x": must be an https URL with a host, e.g. "https://203.0.113.10:6443"` +
		"\nconfig.toml: kubernetes.version: missing (required)"
	if err == nil || err.Error() != want {
		t.Errorf("got:\n%v\nwant:\n%s", err, want)
	}

	cases := []struct {
		e    Error
		want string
	}{
		{Error{File: "c.toml", Line: 3, Key: "a.b", Value: `"x"`, Msg: "bad"}, `c.toml:3: a.b = "x": bad`},
		{Error{File: "c.toml", Key: "a.b", Msg: "missing (required)"}, `c.toml: a.b: missing (required)`},
		{Error{Line: 7, Msg: "expected value (column 3)"}, `line 7: expected value (column 3)`},
		{Error{Key: "a", Msg: "bad"}, `a: bad`},
	}
	for _, c := range cases {
		if got := c.e.Error(); got != c.want {
			t.Errorf("Error() = %q, want %q", got, c.want)
		}
	}
}

// Validate works without a file, for configurations read back from JSON.
func TestValidateWithoutFile(t *testing.T) {
	cfg := mustParse(t, minimal)
	cfg.Cluster.Server = "http://203.0.113.10"
	err := cfg.Validate()
	want := `cluster.server = "http://203.0.113.10": must be an https URL with a host, e.g. "https://203.0.113.10:6443"`
	if err == nil || err.Error() != want {
		t.Errorf("Validate() = %v, want %s", err, want)
	}
}

// Validation refuses what the host would refuse later: a
// slot name ending in '-' (not a valid machine name) and unclean absolute
// paths.
func TestValidationMatchesTheHost(t *testing.T) {
	runErrorCases(t, []errorCase{
		{"slot ending in -", with(minimal, "isolation", `slots = ["a-", "b"]`),
			[]want{{"isolation.slots[0]", `"a-"`, "slot name must be", `slots =`}}},
		{"unclean CA path", with(minimal, "cluster", `ca_file = "/srv/../../etc/shadow"`),
			[]want{{"cluster.ca_file", `"/srv/../../etc/shadow"`, "must be a clean absolute path", `ca_file =`}}},
		{"trailing slash path", with(minimal, "cluster", `ca_file = "/etc/kubeslot/ca.crt/"`),
			[]want{{"cluster.ca_file", `"/etc/kubeslot/ca.crt/"`, "must be a clean absolute path", `ca_file =`}}},
	})
}
