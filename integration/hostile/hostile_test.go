package hostile

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
)

// Secrets planted in the inputs; none may appear in any output.
const (
	tokenSecret = "0123456789abcdef" // the secret half of the join token
	token       = "abcdef." + tokenSecret
	urlPassword = "hunter2pw"
	urlSig      = "sekr1tsig"
)

// credURL is a download URL with credentials and a pre-signed query.
var credURL = "http://user:" + urlPassword + "@127.0.0.1:1/bundle.tar.gz?X-Amz-Signature=" + urlSig

var secrets = []string{tokenSecret, urlPassword, urlSig}

var bins string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kubeslot-hostile-bins-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cmd := exec.Command("go", "build", "-tags=kubeslot_testhooks", "-o", dir+"/", "github.com/kubeslot/kubeslot/cmd/...")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build the binaries: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	bins = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// env is one case's sandbox: its own root prefix and a scratch directory.
type env struct {
	t       *testing.T
	prefix  string
	scratch string
	root    *hostroot.Root
}

func (e *env) file(name, content string, mode os.FileMode) string {
	e.t.Helper()
	p := filepath.Join(e.scratch, name)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		e.t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// hostFile writes a file at a path inside kubeslot's base.
func (e *env) hostFile(content string, elem ...string) string {
	e.t.Helper()
	p := filepath.Join(append([]string{e.prefix, "opt", "kubeslot"}, elem...)...)
	os.MkdirAll(filepath.Dir(p), 0o700)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		e.t.Fatal(err)
	}
	return p
}

func (e *env) fifo(p string) string {
	e.t.Helper()
	os.MkdirAll(filepath.Dir(p), 0o700)
	os.Remove(p)
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// config is a valid configuration with the planted token; edit replaces
// lines.
func (e *env) config(edit ...string) string {
	e.t.Helper()
	text := string(config.Example())
	for i := 0; i+1 < len(edit); i += 2 {
		if !strings.Contains(text, edit[i]) {
			e.t.Fatalf("example config lacks %q", edit[i])
		}
		text = strings.Replace(text, edit[i], edit[i+1], 1)
	}
	return e.file("config.toml", text, 0o600)
}

// etcConfig writes the operator's configuration (/etc/kubeslot/config.toml) under the root prefix.
func (e *env) etcConfig(content string) {
	e.t.Helper()
	p := filepath.Join(e.prefix, "etc", "kubeslot", "config.toml")
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		e.t.Fatal(err)
	}
}

// exampleToken is the token line of the example configuration.
const exampleToken = `bootstrap_token = "abcdef.0123456789abcdef"`

// installed lays down a completed installation (record, applied slot a,
// active, layout, current release) under the case's root prefix.
func (e *env) installed() {
	e.t.Helper()
	testhost.Installed(e.t, e.root, testhost.Example(e.t))
	base, _ := e.root.Path()
	os.MkdirAll(filepath.Join(base, "releases", "blue"), 0o755)
	os.Symlink("releases/blue", filepath.Join(base, "current"))
}

type hcase struct {
	name  string
	bin   string
	setup func(e *env) []string // returns the arguments (the root prefix is added)
	// noPrefix: do not add --root-prefix (the case sets it itself).
	noPrefix bool
	environ  []string
	stdin    string
	code     int      // expected exit code
	want     []string // substrings of stdout+stderr
	// stdoutIsArtifact: stdout is the product (an Ignition config holds
	// the token by design); only stderr is searched for secrets.
	stdoutIsArtifact bool
	check            func(e *env, out string)
}

func run(t *testing.T, c hcase) {
	e := &env{t: t, prefix: t.TempDir(), scratch: t.TempDir()}
	e.root = testkit.RootAt(t, e.prefix)
	args := c.setup(e)
	if !c.noPrefix {
		args = append([]string{"--root-prefix", e.prefix}, args...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bins, c.bin), args...)
	cmd.Env = append(testkit.CleanEnv(), c.environ...)
	cmd.Stdin = strings.NewReader(c.stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %v: still running after 20 s (a hang)\nstdout %s\nstderr %s", c.bin, args, stdout.String(), stderr.String())
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	out := stdout.String() + stderr.String()
	if code != c.code {
		t.Errorf("%s %v: exit %d, want %d\n%s", c.bin, args, code, c.code, out)
	}
	for _, w := range c.want {
		if !strings.Contains(out, w) {
			t.Errorf("%s: output lacks %q:\n%s", c.bin, w, out)
		}
	}
	searched := out
	if c.stdoutIsArtifact {
		searched = stderr.String()
	}
	for _, s := range secrets {
		if strings.Contains(searched, s) {
			t.Errorf("%s %v: a planted secret (%q) reached the output:\n%s", c.bin, args, s, searched)
		}
	}
	if c.check != nil {
		c.check(e, out)
	}
}

var allBinaries = []string{"kubeslot", "kubeslot-bootstrap", "kubeslot-watcher", "kubeslot-repaver", "kubeslot-upgrader", "kubeslot-resetter"}

// TestCorpus runs every case, each in a root prefix of its own.
func TestCorpus(t *testing.T) {
	var cases []hcase
	// An empty root prefix or host root never means "/".
	for _, b := range allBinaries {
		args := []string{}
		if b == "kubeslot" {
			args = []string{"status"}
		}
		cases = append(cases,
			hcase{name: b + " empty --root-prefix", bin: b, noPrefix: true, code: 2, want: []string{"--root-prefix", "empty"},
				setup: func(*env) []string { return append(append([]string{}, args...), "--root-prefix", "") }},
			hcase{name: b + " empty KUBESLOT_ROOT_PREFIX", bin: b, noPrefix: true, code: 2, want: []string{"empty"},
				environ: []string{"KUBESLOT_ROOT_PREFIX="}, setup: func(*env) []string { return args }},
			hcase{name: b + " empty --host-root", bin: b, code: 2, want: []string{"--host-root", "empty"},
				setup: func(*env) []string { return append(append([]string{}, args...), "--host-root", "") }},
		)
	}
	cases = append(cases, corpus...)
	cases = append(cases, configCases()...)
	cases = append(cases, stateCases()...)
	cases = append(cases, bundleCases()...)
	cases = append(cases, flagCases()...)
	cases = append(cases, lockCases()...)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			run(t, c)
		})
	}
}

var corpus = []hcase{
	// Request files of another kind, or garbage.
	{name: "status lists claimed and refused requests", bin: "kubeslot", code: 0,
		want: []string{"claimed-restart.json (restart-3-op)", "Refused requests:"},
		setup: func(e *env) []string {
			e.installed()
			e.hostFile(`{"kind":"restart","id":"restart-3-op"}`, "state", "claimed-restart.json")
			e.hostFile(`{"kind":"restart"}`, "state", "rejected-repave-request-1.json")
			return []string{"status"}
		}},
	{name: "status with a repave request holding a restart", bin: "kubeslot", code: 0, want: []string{"repave.json"},
		setup: func(e *env) []string {
			e.installed()
			e.hostFile(`{"kind":"restart","id":"restart-3-op"}`, "requests", "repave.json")
			return []string{"status"}
		}},

	// Secrets are redacted by type, wherever they are printed.
	{name: "config check dotted token key", bin: "kubeslot", code: 1, want: []string{"bootstrap_token.value", "[redacted]"},
		setup: func(e *env) []string {
			return []string{"config", "check", e.config(exampleToken, `bootstrap_token.value = "`+token+`"`)}
		}},
	{name: "config check token of the wrong form", bin: "kubeslot", code: 1, want: []string{"bootstrap_token"},
		setup: func(e *env) []string {
			return []string{"config", "check", e.config(exampleToken, `bootstrap_token = "`+tokenSecret+`"`)}
		}},
	{name: "config check server with credentials", bin: "kubeslot", code: 1, want: []string{"cluster.server"},
		setup: func(e *env) []string {
			return []string{"config", "check", e.config(`server = "https://203.0.113.10:6443"`, `server = "https://admin:`+urlPassword+`@203.0.113.10:6443/?sig=`+urlSig+`"`)}
		}},
	{name: "bootstrap dotted token key", bin: "kubeslot-bootstrap", code: 1, want: []string{"[redacted]"},
		setup: func(e *env) []string {
			return append(e.noBus(), "--config", e.config(exampleToken, `bootstrap_token.value = "`+token+`"`))
		}},
	{name: "bootstrap json log of a dotted token key", bin: "kubeslot-bootstrap", code: 1, want: []string{"[redacted]"},
		setup: func(e *env) []string {
			return append(e.noBus(), "--log-format", "json", "--config", e.config(exampleToken, `bootstrap_token.value = "`+token+`"`))
		}},
	{name: "bootstrap preflight pre-signed rootfs URL", bin: "kubeslot-bootstrap", code: 1, want: []string{"would be provisioned from http://127.0.0.1:1/rootfs.tar.zst"},
		environ: []string{"KUBESLOT_SKIP_SANDBOX_IMAGE_CHECK=1"},
		setup: func(e *env) []string {
			return []string{"--preflight", "--config", e.config(`source = "https://images.example.com/kubeslot/node-rootfs-1.37.2.tar.zst"`, `source = "http://127.0.0.1:1/rootfs.tar.zst?X-Amz-Signature=`+urlSig+`"`)}
		}},
	{name: "ignition pre-signed release URL and dotted token", bin: "kubeslot", code: 1, want: []string{"[redacted]"},
		setup: func(e *env) []string {
			rel := filepath.Join(e.scratch, "rel")
			os.MkdirAll(rel, 0o755)
			os.WriteFile(filepath.Join(rel, "kubeslot-bootstrap"), []byte("\x7fELF fake"), 0o755)
			return []string{"ignition", "--config", e.config(exampleToken, `bootstrap_token.value = "`+token+`"`), "--release", rel, "--release-url", credURL}
		}},
	{name: "ignition pre-signed release URL", bin: "kubeslot", code: 0, stdoutIsArtifact: true, want: []string{"fetched from http://127.0.0.1:1/bundle.tar.gz and verified"},
		setup: func(e *env) []string {
			rel := filepath.Join(e.scratch, "rel")
			os.MkdirAll(rel, 0o755)
			os.WriteFile(filepath.Join(rel, "kubeslot-bootstrap"), []byte("\x7fELF fake"), 0o755)
			return []string{"ignition", "--config", e.config(), "--release", rel, "--release-url", credURL}
		}},
	{name: "upgrader preflight of a pre-signed request", bin: "kubeslot-upgrader", code: 0, want: []string{"bundle: http://127.0.0.1:1/bundle.tar.gz", "nothing was changed"},
		setup: func(e *env) []string {
			e.installed()
			e.hostFile(`{"kind":"upgrade","id":"upgrade-2-op","upgrade":{"url":"`+credURL+`","sha256":"`+strings.Repeat("ab", 32)+`"}}`, "requests", "upgrade.json")
			return []string{"--preflight"}
		}},
	{name: "upgrader preflight json of a pre-signed request", bin: "kubeslot-upgrader", code: 0, want: []string{`"source": "http://127.0.0.1:1/bundle.tar.gz"`},
		setup: func(e *env) []string {
			e.installed()
			e.hostFile(`{"kind":"upgrade","id":"upgrade-2-op","upgrade":{"url":"`+credURL+`","sha256":"`+strings.Repeat("ab", 32)+`"}}`, "requests", "upgrade.json")
			return []string{"--preflight", "--json"}
		}},
	{name: "resetter dry run of an installation with the token applied", bin: "kubeslot-resetter", code: 0,
		setup: func(e *env) []string {
			e.installed()
			return []string{"--dry-run"}
		}},
	// The dry run reads the operator's configuration to say the token goes, and never prints it,
	// even from a file that is not TOML around it.
	{name: "resetter dry run names the join token it would remove", bin: "kubeslot-resetter", code: 0,
		want: []string{"remove cluster.bootstrap_token from /etc/kubeslot/config.toml"},
		setup: func(e *env) []string {
			e.installed()
			e.etcConfig(string(config.Example()))
			return []string{"--dry-run"}
		}},
	{name: "resetter dry run of a configuration that is not TOML", bin: "kubeslot-resetter", code: 0,
		want: []string{"BLOCKED: /etc/kubeslot/config.toml", fmt.Sprintf("line %d", exampleLine(exampleToken))},
		setup: func(e *env) []string {
			e.installed()
			e.etcConfig(strings.Replace(string(config.Example()), exampleToken, `bootstrap_token = "`+token, 1))
			return []string{"--dry-run"}
		}},
	{name: "repaver --config with a dotted token key", bin: "kubeslot-repaver", code: 2, want: []string{"[redacted]"},
		setup: func(e *env) []string {
			return append(e.noBus(), "--config", e.config(exampleToken, `bootstrap_token.value = "`+token+`"`))
		}},

	// Links, FIFOs and huge files under the root.
	{name: "status FIFO layout version", bin: "kubeslot", code: 1, want: []string{"FIFO"},
		setup: func(e *env) []string {
			e.installed()
			p, _ := e.root.Path(hostroot.LayoutFile)
			e.fifo(p)
			return []string{"status"}
		}},
	{name: "status huge applied file", bin: "kubeslot", code: 1, want: []string{"larger than allowed"},
		setup: func(e *env) []string {
			e.installed()
			p, _ := e.root.Path(hostroot.AppliedDir, "a.json")
			os.Truncate(p, 3<<30)
			return []string{"status"}
		}},
	{name: "status ownership record is a link", bin: "kubeslot", code: 1, want: []string{"not a regular file"},
		setup: func(e *env) []string {
			e.installed()
			p, _ := e.root.File(hostroot.OwnershipFile)
			os.Remove(p)
			os.Symlink("/etc/passwd", p)
			return []string{"status"}
		}},
	{name: "config check FIFO", bin: "kubeslot", code: 1, want: []string{"not a regular file"},
		setup: func(e *env) []string { return []string{"config", "check", e.fifo(filepath.Join(e.scratch, "c.toml"))} }},
	{name: "config check endless stdin", bin: "kubeslot", code: 1, want: []string{"larger than allowed"}, stdin: strings.Repeat("#", 2<<20),
		setup: func(e *env) []string { return []string{"config", "check", "-"} }},
	{name: "config check /dev/zero", bin: "kubeslot", code: 1, want: []string{"not a regular file"},
		setup: func(e *env) []string { return []string{"config", "check", "/dev/zero"} }},
	{name: "ignition FIFO in the release", bin: "kubeslot", code: 1, want: []string{"not a regular file"},
		setup: func(e *env) []string {
			rel := filepath.Join(e.scratch, "rel")
			os.MkdirAll(rel, 0o755)
			os.WriteFile(filepath.Join(rel, "kubeslot-bootstrap"), []byte("\x7fELF fake"), 0o755)
			e.fifo(filepath.Join(rel, "kubeslot-watcher"))
			return []string{"ignition", "--config", e.config(), "--release", rel, "--embed"}
		}},
	{name: "bootstrap config FIFO", bin: "kubeslot-bootstrap", code: 1, want: []string{"not a regular file"},
		setup: func(e *env) []string {
			return append(e.noBus(), "--config", e.fifo(filepath.Join(e.scratch, "c.toml")))
		}},
	{name: "upgrader bundle FIFO", bin: "kubeslot-upgrader", code: 1, want: []string{"not a regular file"},
		setup: func(e *env) []string {
			e.installed()
			return []string{"--preflight", "--bundle", e.fifo(filepath.Join(e.scratch, "b.tar.gz"))}
		}},
	{name: "lock file is a link", bin: "kubeslot-upgrader", code: 1, want: []string{"not a regular file"},
		setup: func(e *env) []string {
			e.installed()
			victim := filepath.Join(e.prefix, "etc", "shadow")
			os.MkdirAll(filepath.Dir(victim), 0o755)
			os.WriteFile(victim, []byte("root:x\n"), 0o600)
			lock, _ := e.root.Lock()
			os.MkdirAll(filepath.Dir(lock), 0o755)
			os.Symlink("/etc/shadow", lock)
			return append(e.noBus(), "--lock-wait", "1s")
		},
		check: func(e *env, out string) {
			b, _ := os.ReadFile(filepath.Join(e.prefix, "etc", "shadow"))
			fi, _ := os.Stat(filepath.Join(e.prefix, "etc", "shadow"))
			if string(b) != "root:x\n" || fi.Mode().Perm() != 0o600 {
				e.t.Errorf("the lock link's target changed: %q %v", b, fi.Mode())
			}
		}},

	// Validation refuses what the host would refuse later.
	{name: "config check slot ending in -", bin: "kubeslot", code: 1, want: []string{"isolation.slots"},
		setup: func(e *env) []string {
			return []string{"config", "check", e.config(`slots = ["a", "b"]`, `slots = ["a-", "b"]`)}
		}},
	{name: "config check unclean absolute path", bin: "kubeslot", code: 1, want: []string{"clean absolute path"},
		setup: func(e *env) []string {
			return []string{"config", "check", e.config(`ca_file = "/etc/kubeslot/cluster-ca.crt"`, `ca_file = "/srv/../../etc/shadow"`)}
		}},

	// A world-readable configuration with a join token.
	{name: "config check world-readable token", bin: "kubeslot", code: 0, want: []string{"readable by others", "chmod 600"},
		setup: func(e *env) []string {
			p := e.config()
			os.Chmod(p, 0o644)
			return []string{"config", "check", p}
		}},

	// Status and messages.
	{name: "status future layout version", bin: "kubeslot", code: 1, want: []string{"PROBLEM", "layout version 9"},
		setup: func(e *env) []string {
			e.installed()
			e.hostFile("9\n", "layout-version")
			return []string{"status"}
		}},
	{name: "status terminal escapes in the record", bin: "kubeslot", code: 1, want: []string{`\x1b]0;pwned`},
		setup: func(e *env) []string {
			e.installed()
			p, _ := e.root.File(hostroot.OwnershipFile)
			b, _ := os.ReadFile(p)
			os.WriteFile(p, bytes.Replace(b, []byte(`"machine": "worker-1"`), []byte(`"machine": "worker-1\u001b]0;pwned\u0007"`), 1), 0o600)
			return []string{"status"}
		},
		check: func(e *env, out string) {
			if strings.ContainsAny(out, "\x1b\x07") {
				e.t.Errorf("escape sequences reached the terminal: %q", out)
			}
		}},
	{name: "status damaged record", bin: "kubeslot", code: 1, want: []string{"damaged record", "kubeslot-resetter --force"},
		setup: func(e *env) []string {
			e.installed()
			e.hostFile(`{"schemaVersion": 1, "jour`, "ownership.json")
			return []string{"status"}
		}},
	{name: "resetter dry run of a damaged record", bin: "kubeslot-resetter", code: 1, want: []string{"--force"},
		setup: func(e *env) []string {
			e.installed()
			e.hostFile(`{"schemaVersion": 1, "jour`, "ownership.json")
			return []string{"--dry-run"}
		}},
	{name: "resetter forced dry run of a damaged record", bin: "kubeslot-resetter", code: 0, want: []string{"lost, not undone: the whole journal", "dry run: nothing was changed"},
		setup: func(e *env) []string {
			e.installed()
			e.hostFile(`{"schemaVersion": 1, "jour`, "ownership.json")
			return []string{"--dry-run", "--force"}
		}},

	// A root prefix other than / never reaches this machine's own
	// systemd; with no --systemd-bus a stage that needs it is refused at
	// start-up (the resetter: at its first systemd call).
	{name: "resetter in a sandbox without a bus", bin: "kubeslot-resetter", code: 2, want: []string{"--systemd-bus", "refusing to act on this machine's own systemd", "nothing was changed"},
		setup: func(e *env) []string {
			e.installed()
			return []string{"--yes", "--lock-wait", "2s"}
		}},
	{name: "repaver restart in a sandbox without a bus", bin: "kubeslot-repaver", code: 2, want: []string{"--systemd-bus", "nothing was changed"},
		setup: func(e *env) []string {
			e.installed()
			return []string{"--restart", "--lock-wait", "2s"}
		}},
	{name: "resetter in a sandbox with a bus that is not there", bin: "kubeslot-resetter", code: 1, want: []string{"no-such-bus"},
		setup: func(e *env) []string {
			e.installed()
			return []string{"--yes", "--lock-wait", "2s", "--systemd-bus", "unix:path=" + e.scratch + "/no-such-bus"}
		}},
}

// exampleLine is the 1-based line of config.Example() that holds s.
func exampleLine(s string) int {
	before, _, _ := strings.Cut(string(config.Example()), s)
	return strings.Count(before, "\n") + 1
}
