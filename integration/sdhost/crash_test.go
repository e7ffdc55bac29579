package sdhost

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHostDiesWithItsTestBinary: a test binary that dies without cleanup (a -timeout panic, a SIGKILL) takes its
// hosts down with it, and the next Start of the same name reclaims what it left (cgroup and state dirs).
// The crashing binary is this one, re-run in a child process.
func TestHostDiesWithItsTestBinary(t *testing.T) {
	if name := os.Getenv("SDHOST_CRASH_CHILD"); name != "" {
		h, err := Start(context.Background(), Options{Name: name})
		if err != nil {
			fmt.Println("error:", strings.ReplaceAll(err.Error(), "\n", " "))
			os.Exit(1)
		}
		fmt.Println("pid", h.PID())
		select {} // wait for SIGKILL
	}
	if err := Available(); err != nil {
		t.Skipf("isolated systemd host not available here: %v", err)
	}
	name := fmt.Sprintf("crash-%d", os.Getpid())
	child := exec.Command(os.Args[0], "-test.run=^TestHostDiesWithItsTestBinary$")
	child.Env = append(os.Environ(), "SDHOST_CRASH_CHILD="+name)
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "pid ")))
	if err != nil {
		_ = child.Process.Kill()
		_ = child.Wait()
		t.Fatalf("child: %q", line)
	}
	pidNS, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
	t0 := time.Now()
	_ = child.Process.Kill()
	_ = child.Wait()
	for {
		// A recycled PID would be in another pid namespace.
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err != nil || ns != pidNS {
			break
		}
		if time.Since(t0) > 15*time.Second {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("host PID %d still alive %v after its test binary was killed", pid, time.Since(t0))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("host gone %v after its test binary was killed", time.Since(t0).Round(time.Millisecond))
	state := filepath.Join(os.TempDir(), rigDir, name)
	if _, err := os.Stat(state); err != nil {
		t.Errorf("expected the crashed run's state dir %s to be left: %v", state, err)
	}

	h, err := Start(context.Background(), Options{Name: name})
	if err != nil {
		t.Fatalf("Start over a crashed host's leftovers: %v", err)
	}
	if err := h.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(state); err == nil {
		t.Errorf("state dir %s still there after Stop", state)
	}
	dirs, _, _ := cgroupDirs("unified", name)
	for _, d := range dirs {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("cgroup dir %s still there after Stop", d)
		}
	}
}
