package workload

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestGreetingMatchesApp(t *testing.T) {
	if !strings.Contains(string(appSource), "const greeting = \""+Greeting+"\"") {
		t.Fatalf("app/main.go's greeting differs from Greeting %q", Greeting)
	}
}

// running is a started app with its stdout read line by line.
type running struct {
	cmd   *exec.Cmd
	lines chan string
}

func start(t *testing.T, argv0 string, args ...string) *running {
	t.Helper()
	cmd := exec.Command(argv0, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &running{cmd: cmd, lines: make(chan string, 100)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			r.lines <- sc.Text()
		}
		close(r.lines)
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return r
}

func (r *running) line(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-r.lines:
		if !ok {
			t.Fatal("app closed its stdout")
		}
		return l
	case <-time.After(10 * time.Second):
		t.Fatal("no line from the app in 10s")
	}
	return ""
}

// stop sends SIGTERM and wants a prompt exit 0.
func (r *running) stop(t *testing.T) {
	t.Helper()
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("app after SIGTERM: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("app still running 5s after SIGTERM")
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestAppServes(t *testing.T) {
	app := Build(t)
	r := start(t, app.Binary, "-addr", "127.0.0.1:0")
	first := r.line(t)
	i := strings.LastIndex(first, " serving on ")
	if i < 0 {
		t.Fatalf("first line %q does not say where it serves", first)
	}
	base := "http://" + first[i+len(" serving on "):]
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}

	if code, body := get(t, base+"/"); code != 200 || body != host+"\n"+Greeting+"\n" {
		t.Fatalf("GET /: %d %q", code, body)
	}
	if l := r.line(t); !strings.Contains(l, "request GET / from 127.0.0.1:") || !strings.HasSuffix(l, ": 200") {
		t.Fatalf("log line for GET /: %q", l)
	}
	if code, body := get(t, base+"/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("GET /healthz: %d %q", code, body)
	}
	if l := r.line(t); !strings.Contains(l, "request GET /healthz ") {
		t.Fatalf("log line for GET /healthz: %q", l)
	}
	if code, _ := get(t, base+"/nope"); code != 404 {
		t.Fatalf("GET /nope: %d, want 404", code)
	}
	if l := r.line(t); !strings.HasSuffix(l, ": 404") {
		t.Fatalf("log line for GET /nope: %q", l)
	}
	r.stop(t)
}

func TestAppPauses(t *testing.T) {
	app := Build(t)
	// by argument, and by name: the image's /pause is a symlink to /app
	link := filepath.Join(t.TempDir(), "pause")
	if err := os.Symlink(app.Binary, link); err != nil {
		t.Fatal(err)
	}
	for _, argv := range [][]string{{app.Binary, "pause"}, {link}} {
		r := start(t, argv[0], argv[1:]...)
		if l := r.line(t); l != "app: pausing" {
			t.Fatalf("%v: first line %q", argv, l)
		}
		r.stop(t)
	}
}
