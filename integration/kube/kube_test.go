package kube

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestPKISubjects(t *testing.T) {
	p, err := newPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(p.caCert)
	certPEM, _, err := p.clientCert("system:node:node-7", "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(certPEM)
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if c.Subject.CommonName != "system:node:node-7" || !slices.Equal(c.Subject.Organization, []string{"system:nodes"}) {
		t.Errorf("subject %v", c.Subject)
	}
	if _, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("node cert does not verify as a client cert of the CA: %v", err)
	}
	b, err := os.ReadFile(p.path(apiserverCertFile))
	if err != nil {
		t.Fatal(err)
	}
	blk, _ = pem.Decode(b)
	s, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"127.0.0.1", "localhost", "kubernetes.default.svc"} {
		if _, err := s.Verify(x509.VerifyOptions{Roots: roots, DNSName: host}); err != nil {
			t.Errorf("serving cert for %s: %v", host, err)
		}
	}
}

func TestTokensFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.csv")
	users, err := writeTokens(path, []User{{Name: "extra", Groups: []string{"g1", "g2"}}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 22 || len(users) != 22 {
		t.Fatalf("%d lines, %d users; want 22 (admin, 10 nodes, 10 agents, extra)", len(lines), len(users))
	}
	last := lines[21]
	if !strings.HasPrefix(last, users[21].token+",extra,") || !strings.HasSuffix(last, `,"g1,g2"`) {
		t.Errorf("last line %q", last)
	}
	if _, err := writeTokens(path, []User{{Name: "a,b"}}); err == nil {
		t.Error("a user name with a comma was accepted")
	}
}

// The control plane's processes die with the test binary, even when it is killed: a child copy of this test
// binary starts a control plane and is SIGKILLed; etcd and kube-apiserver must follow (Pdeathsig).
func TestProcessesDieWithTestBinary(t *testing.T) {
	if os.Getenv("KUBE_TEST_CHILD") == "1" {
		c, err := Start(context.Background(), Options{BinDir: os.Getenv("KUBE_TEST_BIN"), Dir: os.Getenv("KUBE_TEST_DIR")})
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		for _, p := range c.procs {
			fmt.Println("pid", p.cmd.Process.Pid)
		}
		fmt.Println("ready")
		time.Sleep(time.Hour)
	}
	bin, err := CachedBinDir()
	if err != nil {
		t.Skipf("kube binaries not available: %v", err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestProcessesDieWithTestBinary$", "-test.v")
	cmd.Env = append(os.Environ(), "KUBE_TEST_CHILD=1", "KUBE_TEST_BIN="+bin, "KUBE_TEST_DIR="+t.TempDir())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pids []int
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		if pid, ok := strings.CutPrefix(line, "pid "); ok {
			n, _ := strconv.Atoi(pid)
			pids = append(pids, n)
		}
		if line == "ready" || strings.HasPrefix(line, "error:") {
			t.Log(line)
			break
		}
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if len(pids) != 2 {
		t.Fatalf("child reported pids %v, want etcd and kube-apiserver", pids)
	}
	deadline := time.Now().Add(15 * time.Second)
	for _, pid := range pids {
		for syscall.Kill(pid, 0) == nil {
			if time.Now().After(deadline) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				t.Fatalf("pid %d outlived the killed test binary", pid)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
