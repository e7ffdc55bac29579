package systemdconn

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testBus starts a private dbus-daemon and returns its address.
func testBus(t *testing.T) string {
	t.Helper()
	daemon, err := exec.LookPath("dbus-daemon")
	if err != nil {
		t.Skip("no dbus-daemon on this machine")
	}
	sock := filepath.Join(t.TempDir(), "bus")
	cmd := exec.Command(daemon, "--session", "--nofork", "--print-address", "--address=unix:path="+sock)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("dbus-daemon printed no address: %v", err)
	}
	if !strings.HasPrefix(line, "unix:path="+sock) {
		t.Fatalf("dbus-daemon address %q", line)
	}
	return "unix:path=" + sock
}

// The dial context bounds the dial only: the connection outlives it (a
// connection tied to the dial context would close as soon as it ended).
func TestDialBusOutlivesDialContext(t *testing.T) {
	addr := testBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	conn, err := DialBus(ctx, addr)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	defer conn.Close()
	cancel()
	time.Sleep(100 * time.Millisecond)
	if !conn.Connected() {
		t.Fatal("the connection closed with its dial context")
	}
	var id string
	if err := conn.BusObject().Call("org.freedesktop.DBus.GetId", 0).Store(&id); err != nil || id == "" {
		t.Fatalf("call after the dial context ended: %q, %v", id, err)
	}
}

// A dial context that ends first bounds the dial: a socket nobody answers on
// does not hang it.
func TestDialBusBoundedByContext(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "silent")
	l, err := net.Listen("unix", sock) // accepts, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if _, err := DialBus(ctx, "unix:path="+sock); err == nil {
		t.Fatal("a silent bus was dialled")
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Errorf("the dial took %s past its context", d)
	}
	if _, err := DialBus(ctx, "unix:path="+sock); err == nil {
		t.Fatal("an ended context dialled")
	}
}

// A client with NoMachined connects to systemd only: its machine calls fail
// without dialling machined.
func TestNoMachined(t *testing.T) {
	addr := testBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := &Client{Ctx: ctx, Address: addr, NoMachined: true}
	defer c.Close()
	if _, err := c.Machine(ctx, "a"); !errors.Is(err, errNoMachined) {
		t.Errorf("Machine: %v, want errNoMachined", err)
	}
	if err := c.TerminateMachine(ctx, "a"); !errors.Is(err, errNoMachined) {
		t.Errorf("TerminateMachine: %v, want errNoMachined", err)
	}
	cn, made := c.once.Made()
	if !made || cn.bus != nil {
		t.Errorf("made %v, machined connection %v: want systemd's only", made, cn)
	}
}
