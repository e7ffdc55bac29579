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
	"github.com/kubeslot/kubeslot/lib/clusterinstall"
	"github.com/kubeslot/kubeslot/lib/exitcode"
)

// The cluster commands against a real apiserver are tested in
// integration/cluster/api_test.go; these check the command line.

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

// TestApproveServingFlags: --print-manifests fills in the image and the
// policy flags; bad policy flags are usage errors naming the flag.
func TestApproveServingFlags(t *testing.T) {
	code, out, errs := clitest.Call(run, "", "cluster", "approve-serving", "--print-manifests", "--image", "registry.example/kubeslot:v1",
		"--node-cidrs", "10.213.0.0/16,fd00::/64", "--dns-suffix", "nodes.example.com")
	if code != exitcode.OK {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{`image: "registry.example/kubeslot:v1"`, `"--node-cidrs=10.213.0.0/16,fd00::/64"`,
		`"--service-cidr=10.96.0.0/12"`, `"--dns-suffix=nodes.example.com"`, `"--cluster-domain=cluster.local"`, "kind: Deployment"} {
		if !strings.Contains(out, want) {
			t.Errorf("manifests lack %s:\n%s", want, out)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--print-manifests", "--node-cidrs", "10.0.0.0/8"}, "--image"},
		{[]string{"--print-manifests", "--image", "x"}, "--node-cidrs"},
		{[]string{"--node-cidrs", "10.0.0.300/8"}, "10.0.0.300/8"},
		{[]string{"--service-cidr", "x"}, "--service-cidr"},
		{[]string{"--dns-suffix", "a.cluster.local"}, "--dns-suffix"},
		{[]string{"--watch", "--node", "w1"}, "--node is not used with --watch"},
	} {
		code, _, errs := clitest.Call(run, "", append([]string{"cluster", "approve-serving"}, c.args...)...)
		if code != exitcode.Usage || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %s; want a usage error naming %s", c.args, code, errs, c.want)
		}
	}
}

// cluster manifests prints the library's stream; --kustomize writes its base.
func TestClusterManifests(t *testing.T) {
	var want strings.Builder
	if err := clusterinstall.WriteYAML(&want); err != nil {
		t.Fatal(err)
	}
	code, out, errs := clitest.Call(run, "", "cluster", "manifests")
	if code != exitcode.OK || out != want.String() {
		t.Errorf("cluster manifests: exit %d, %d bytes (want %d)\n%s", code, len(out), want.Len(), errs)
	}
	dir := filepath.Join(t.TempDir(), "base")
	code, out, errs = clitest.Call(run, "", "cluster", "manifests", "--kustomize", dir)
	if code != exitcode.OK {
		t.Fatalf("cluster manifests --kustomize: exit %d\n%s%s", code, out, errs)
	}
	files, err := clusterinstall.KustomizeBase()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if b, err := os.ReadFile(filepath.Join(dir, f.Name)); err != nil || string(b) != string(f.Data) {
			t.Errorf("%s: %v, or not what KustomizeBase generates", f.Name, err)
		}
	}
}
