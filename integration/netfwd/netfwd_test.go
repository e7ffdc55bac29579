package netfwd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// These need root (they enter network namespaces); without it they skip, unless KUBESLOT_REQUIRE_RIG=1. Each test
// makes its own throwaway namespace: a child `unshare --net` that brings its lo up and sleeps. Nothing here changes
// the machine's namespace.

// privateNetNS starts a process in a new network namespace whose lo is up, and returns that namespace's path.
func privateNetNS(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("KUBESLOT_REQUIRE_RIG") == "1" {
			t.Fatal("KUBESLOT_REQUIRE_RIG=1 but not root")
		}
		t.Skip("needs root")
	}
	cmd := exec.Command("unshare", "--net", "--", "/bin/sh", "-c", "ip link set lo up && echo up && exec sleep 600")
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "up\n" {
		t.Fatalf("namespace process: %q %v", line, err)
	}
	ns := fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid)
	if same, err := SameNamespace(ns, ""); err != nil || same {
		t.Fatalf("SameNamespace(%s, own) = %v, %v", ns, same, err)
	}
	return ns
}

// serveHTTP answers every request with body on l until the test ends.
func serveHTTP(t *testing.T, l net.Listener, body string) {
	t.Helper()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, body) })}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
}

// get does one HTTP GET over a connection made by dial.
func get(dial func(ctx context.Context) (net.Conn, error)) (string, error) {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) }}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	resp, err := hc.Get("http://rig.invalid/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// goroutinesSettle waits until the goroutine count is back to at most n.
func goroutinesSettle(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("goroutines: %d, want <= %d:\n%s", runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestForwardIntoNamespace(t *testing.T) {
	ns := privateNetNS(t)
	machine, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveHTTP(t, machine, "machine")
	base := runtime.NumGoroutine()

	// Inside the namespace, the machine's loopback port is not there...
	if c, err := Dial(context.Background(), ns, "tcp", machine.Addr().String()); err == nil {
		c.Close()
		t.Fatalf("reached the machine's %s from inside the namespace without a forwarder", machine.Addr())
	}
	// ...until a forwarder listens on the same address inside it.
	f, err := Forward(ns, machine.Addr().String(), "", machine.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Addr().String() != machine.Addr().String() {
		t.Errorf("forwarder at %v, asked for %v", f.Addr(), machine.Addr())
	}
	for i := range 3 {
		body, err := get(func(ctx context.Context) (net.Conn, error) { return Dial(ctx, ns, "tcp", f.Addr().String()) })
		if err != nil || body != "machine" {
			t.Fatalf("GET %d through the forwarder: %q, %v", i, body, err)
		}
	}
	if f.Accepted() != 3 {
		t.Errorf("accepted %d connections, want 3", f.Accepted())
	}
	// The listener is not in the machine's namespace: the machine's own port is the server, not the forwarder.
	if body, err := get(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", f.Addr().String())
	}); err != nil || body != "machine" || f.Accepted() != 3 {
		t.Errorf("machine-side GET: %q %v, forwarder accepted %d", body, err, f.Accepted())
	}

	// An open, idle connection does not keep Close waiting.
	idle, err := Dial(context.Background(), ns, "tcp", f.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	time.Sleep(50 * time.Millisecond)
	t0 := time.Now()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("Close took %v", d)
	}
	_ = idle.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := idle.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("idle connection after Close: read %v, want EOF/reset", err)
	}
	idle.Close()
	goroutinesSettle(t, base)
}

func TestConnectProxyDialsInsideTheRoutedNamespace(t *testing.T) {
	ns := privateNetNS(t)
	inside, err := Listen(ns, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveHTTP(t, inside, "node")
	port := inside.Addr().(*net.TCPAddr).Port
	base := runtime.NumGoroutine()

	sock := filepath.Join(t.TempDir(), "egress.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	p := ServeConnect(ul, func(host string) (string, string, error) {
		if host == "10.213.77.2" || host == "node-a" {
			return ns, "127.0.0.1", nil
		}
		return "", "", fmt.Errorf("%s: %w", host, ErrNoRoute)
	}, nil)
	defer p.Close()

	connect := func(ctx context.Context, target string) (net.Conn, int, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", sock)
		if err != nil {
			return nil, 0, err
		}
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", target)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			c.Close()
			return nil, 0, err
		}
		if resp.StatusCode != 200 || br.Buffered() > 0 {
			c.Close()
			return nil, resp.StatusCode, nil
		}
		return c, 200, nil
	}
	for _, host := range []string{"10.213.77.2", "node-a"} {
		body, err := get(func(ctx context.Context) (net.Conn, error) {
			c, code, err := connect(ctx, net.JoinHostPort(host, fmt.Sprint(port)))
			if err == nil && code != 200 {
				err = fmt.Errorf("CONNECT: %d", code)
			}
			return c, err
		})
		if err != nil || body != "node" {
			t.Fatalf("GET via CONNECT %s: %q, %v", host, body, err)
		}
	}
	if _, code, err := connect(context.Background(), "192.0.2.1:80"); err != nil || code != http.StatusForbidden {
		t.Errorf("CONNECT to an unrouted host: %d, %v; want 403", code, err)
	}
	if _, code, err := connect(context.Background(), net.JoinHostPort("node-a", "1")); err != nil || code != http.StatusBadGateway {
		t.Errorf("CONNECT to a closed port: %d, %v; want 502", code, err)
	}
	// A request that is not CONNECT.
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET to the proxy: %v %v", resp, err)
	}
	c.Close()

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sock); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("socket file after Close: %v", err)
	}
	goroutinesSettle(t, base)
}
