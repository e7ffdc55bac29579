package nspawn

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/systemdconn/sdtest"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
)

// newFakeSystemd is the shared fake systemd with machined: starting a node
// unit registers its slot's machine running, stopping it unregisters it.
// newFakeSystemd's machines have a leader PID each (a: 4242, b: 4243), so
// a halt from inside (fakeRunner.halt) ends the right one.
func newFakeSystemd() *sdtest.Systemd {
	sd := sdtest.New(slotOf)
	sd.Leaders = leaders
	return sd
}

var leaders = map[string]int{"a": 4242, "b": 4243}

func slotOf(unit string) string {
	return strings.TrimSuffix(strings.TrimPrefix(unit, "systemd-nspawn@"), ".service")
}

// fakeRunner records commands; answer gives the output for a command line.
// A node's "systemctl --force halt" calls halt with the leader PID it
// entered.
type fakeRunner struct {
	mu     sync.Mutex
	cmds   []string
	answer func(cmd string) ([]byte, error)
	halt   func(leader int)
}

func (r *fakeRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := strings.Join(append([]string{name}, args...), " ")
	r.mu.Lock()
	r.cmds = append(r.cmds, cmd)
	answer, halt := r.answer, r.halt
	r.mu.Unlock()
	if strings.HasSuffix(cmd, "systemctl --force halt") && halt != nil && name == "nsenter" && len(args) > 1 && args[0] == "-t" {
		if pid, err := strconv.Atoi(args[1]); err == nil {
			halt(pid)
		}
	}
	if answer != nil {
		return answer(cmd)
	}
	if strings.HasSuffix(cmd, "systemctl is-system-running") {
		return []byte("running\n"), nil
	}
	return nil, nil
}

// Inner returns the commands run inside nodes, without the nsenter and env
// prefix.
func (r *fakeRunner) Inner() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, c := range r.cmds {
		if i := strings.Index(c, "TERM=dumb "); i >= 0 {
			out = append(out, c[i+len("TERM=dumb "):])
		}
	}
	return out
}

// env is one test host: a temp root prefix with the layout, artifacts in
// <prefix>/srv, an ownership record whose clock notes which slot paths
// existed at every journal entry.
type env struct {
	t       *testing.T
	root    *hostroot.Root
	sd      *sdtest.Systemd
	run     *fakeRunner
	rec     *ownership.Record
	ca      string
	rootfs  []byte // the rootfs tarball
	kubelet []byte
	// existed[i] is what existed (of watched) when clock tick i was taken.
	existed []map[string]bool
	ticks   []time.Time
}

// watched are the host paths whose existence each journal entry is checked
// against.
var watched = []string{
	"/var/lib/machines", "/var/lib/machines/a", "/var/lib/machines/.a.partial", "/etc/systemd/nspawn",
	"/etc/systemd/nspawn/a.nspawn", "/etc/systemd/system/systemd-nspawn@a.service.d",
	"/etc/systemd/system/systemd-nspawn@a.service.d/kubeslot.conf",
}

func newEnv(t *testing.T) *env {
	t.Helper()
	root := testkit.LaidOut(t)
	for _, d := range []string{"var/lib", "etc/systemd/system"} { // as on any host
		if err := os.MkdirAll(filepath.Join(root.Prefix(), d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	e := &env{t: t, root: root, sd: newFakeSystemd(), run: &fakeRunner{}, ca: testkit.CA(t)}
	e.run.halt = e.sd.HaltLeader
	e.rootfs = tarball(t, map[string]string{
		"etc/os-release": "ID=debian\n", "usr/bin/true": "#!/bin/sh\n", "usr/local/bin/": "", "usr/lib/": "",
	})
	e.kubelet = []byte("#!/bin/sh\necho kubelet v1\n")
	e.put("/srv/rootfs.tar", e.rootfs)
	e.put("/srv/kubelet", e.kubelet)
	rec := testhost.Record(t, "worker-1", testhost.Sum)
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	rec.Clock = func() time.Time {
		snap := map[string]bool{}
		for _, p := range watched {
			_, err := os.Lstat(filepath.Join(root.Prefix(), p))
			snap[p] = err == nil
		}
		tick := base.Add(time.Duration(len(e.ticks)) * time.Second)
		e.existed = append(e.existed, snap)
		e.ticks = append(e.ticks, tick)
		return tick
	}
	if err := ownership.Save(root, rec); err != nil {
		t.Fatal(err)
	}
	e.rec = rec
	return e
}

func (e *env) put(hostPath string, data []byte) {
	e.t.Helper()
	local := filepath.Join(e.root.Prefix(), hostPath)
	if err := os.MkdirAll(filepath.Dir(local), 0o755); err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(local, data, 0o644); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) exists(hostPath string) bool {
	_, err := os.Lstat(filepath.Join(e.root.Prefix(), hostPath))
	return err == nil
}

func (e *env) read(hostPath string) string {
	e.t.Helper()
	b, err := os.ReadFile(filepath.Join(e.root.Prefix(), hostPath))
	if err != nil {
		e.t.Fatal(err)
	}
	return string(b)
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// config is a valid configuration over e's artifacts; edit adjusts the TOML.
func (e *env) config(edit func(string) string) *config.Config {
	e.t.Helper()
	doc := fmt.Sprintf(`[machine]
name = "worker-1"

[cluster]
server = "https://203.0.113.10:6443"
ca_pem = """%s"""
bootstrap_token = "abcdef.0123456789abcdef"

[kubernetes]
version = "1.37.2"
taints = ["dedicated=batch:NoSchedule"]

[kubernetes.labels]
"example.com/team" = "infra"

[rootfs]
source = "/srv/rootfs.tar"
sha256 = "%s"

[artifacts.kubelet]
url = "/srv/kubelet"
sha256 = "%s"

[timeouts]
node_ready = "5s"
stop = "2s"
`, e.ca, digest(e.rootfs), digest(e.kubelet))
	if edit != nil {
		doc = edit(doc)
	}
	cfg, err := config.Parse("test.toml", []byte(doc))
	if err != nil {
		e.t.Fatal(err)
	}
	return cfg
}

func (e *env) deps(cfg *config.Config) hostapi.Deps {
	return hostapi.Deps{Root: e.root, Config: cfg, Systemd: e.sd, Exec: e.run, Record: e.rec,
		Log: slog.New(slog.NewTextHandler(e.t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))}
}

func (e *env) backend(cfg *config.Config) *Backend {
	e.t.Helper()
	if cfg == nil {
		cfg = e.config(nil)
	}
	b, err := New(e.deps(cfg))
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

// checkJournalledBeforeCreated: every journal entry's target did not exist
// when the entry was recorded.
func (e *env) checkJournalledBeforeCreated() {
	e.t.Helper()
	for _, c := range e.rec.Journal {
		i := -1
		for j, tk := range e.ticks {
			if tk.Equal(c.At) {
				i = j
			}
		}
		if i < 0 {
			e.t.Errorf("journal entry %s %s: no clock tick at %v", c.Kind, c.Path, c.At)
			continue
		}
		if existed, watchedPath := e.existed[i][c.Path]; !watchedPath {
			e.t.Errorf("journal entry %s %s: path not watched by the test", c.Kind, c.Path)
		} else if existed {
			e.t.Errorf("journal entry %s %s recorded after the path was created", c.Kind, c.Path)
		}
	}
}

func tarball(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, body := range files {
		hdr := &tar.Header{Name: name, Mode: 0o755, Typeflag: tar.TypeReg, Size: int64(len(body)), ModTime: time.Unix(1e9, 0)}
		if strings.HasSuffix(name, "/") {
			hdr.Typeflag, hdr.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }

func machineRunning(slot string) hostapi.Machine {
	return hostapi.Machine{Name: slot, State: "running", Leader: leaders[slot], Class: "container", Service: unitName(slot)}
}

// healthzServer serves h on a free loopback port for the test's life (the
// kubelet's healthz, as KubeletHealthy reaches it) and returns the port.
func healthzServer(t *testing.T, h http.HandlerFunc) int {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return ln.Addr().(*net.TCPAddr).Port
}
