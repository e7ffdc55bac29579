package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kubeslot/kubeslot/lib/cli/clitest"
	"github.com/kubeslot/kubeslot/lib/exitcode"
)

// The cluster commands against a real apiserver are tested in
// integration/api_test.go; these check the command line.

func TestClusterHelp(t *testing.T) {
	code, out, _ := clitest.Call(run, "", "cluster", "--help")
	if code != exitcode.OK || !strings.Contains(out, "install") || !strings.Contains(out, "uninstall") {
		t.Errorf("cluster --help: exit %d\n%s", code, out)
	}
	code, out, _ = clitest.Call(run, "", "cluster", "uninstall", "--help")
	if code != exitcode.OK || !strings.Contains(out, "--delete-objects") || !strings.Contains(out, "--kubeconfig") {
		t.Errorf("cluster uninstall --help: exit %d\n%s", code, out)
	}
}

// kubeconfigFor writes a kubeconfig for server into a temporary file.
func kubeconfigFor(t *testing.T, server string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: " + server +
		"\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
	if err := os.WriteFile(f, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestClusterKubeconfigChoice(t *testing.T) {
	t.Setenv("HOME", t.TempDir()) // no ~/.kube/config to fall back to
	var hits atomic.Int32
	var agent atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		agent.Store(r.Header.Get("User-Agent"))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403,"message":"not you"}`))
	}))
	defer srv.Close()
	good := kubeconfigFor(t, srv.URL)
	missing := filepath.Join(t.TempDir(), "missing")

	// $KUBECONFIG is used...
	t.Setenv("KUBECONFIG", good)
	code, _, errs := clitest.Call(run, "", "cluster", "install", "--timeout", "10s")
	if code != exitcode.Failure || hits.Load() == 0 || !strings.Contains(errs, "not you") {
		t.Errorf("install with $KUBECONFIG: exit %d after %d requests, want 1 and a refusal\n%s", code, hits.Load(), errs)
	}
	if ua, _ := agent.Load().(string); ua != name {
		t.Errorf("User-Agent %q, want %q", ua, name)
	}
	// ... and --kubeconfig wins over it
	t.Setenv("KUBECONFIG", missing)
	hits.Store(0)
	if code, _, _ := clitest.Call(run, "", "cluster", "uninstall", "--kubeconfig", good, "--timeout", "10s"); code != exitcode.Failure || hits.Load() == 0 {
		t.Errorf("uninstall --kubeconfig: exit %d after %d requests", code, hits.Load())
	}
	// a kubeconfig that does not exist is a usage error naming it
	code, _, errs = clitest.Call(run, "", "cluster", "install", "--kubeconfig", missing)
	if code != exitcode.Usage || !strings.Contains(errs, "kubeconfig") || !strings.Contains(errs, missing) {
		t.Errorf("install --kubeconfig %s: exit %d, want %d\n%s", missing, code, exitcode.Usage, errs)
	}
	// no configuration at all
	t.Setenv("KUBECONFIG", "")
	if code, _, errs := clitest.Call(run, "", "cluster", "install"); code != exitcode.Usage || !strings.Contains(errs, "kubeconfig") {
		t.Errorf("install without any kubeconfig: exit %d, want %d\n%s", code, exitcode.Usage, errs)
	}
}
