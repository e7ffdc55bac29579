package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// heavyPackages must stay out of the watcher: the typed clientset registers
// every API group at init, which costs the idle watcher megabytes of heap
// and text pages. The watcher needs client-go's rest
// and tools/cache only; code it shares with the stages lives in packages
// that do not import the clientset (lib/sandbox, lib/systemdconn,
// lib/nodeidentity), never in lib/bootstrap or lib/nodeclient.
//
// k8s.io/api is out too: core/v1 alone is ~1.9 MB of code
// and as many MB of the binary's mapped, resident pages; the watcher reads
// its Node and writes Events through lib/watcher's own small types.
//
// gRPC is out too: only the repaver talks to a node's CRI (lib/cri), and
// gRPC's init registrations would touch pages of the idle watcher.
var heavyPackages = []string{
	"k8s.io/client-go/kubernetes",
	"k8s.io/api",
	"github.com/kubeslot/kubeslot/lib/bootstrap",
	"github.com/kubeslot/kubeslot/lib/nodeclient",
	"github.com/kubeslot/kubeslot/lib/cri",
	"google.golang.org/grpc",
}

// TestNoHeavyDependencies fails when the watcher's import graph includes a
// package of heavyPackages (or one below it), naming who imports it.
func TestNoHeavyDependencies(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the dependencies with:", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	// Every package of the graph with its direct imports, one per line.
	out, err := exec.CommandContext(ctx, goBin, "list", "-deps",
		"-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, ".").Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list -deps: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list -deps: %v", err)
	}
	heavy := func(p string) bool {
		for _, h := range heavyPackages {
			if p == h || strings.HasPrefix(p, h+"/") {
				return true
			}
		}
		return false
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 10 {
		t.Fatalf("go list -deps listed %d packages, want the whole graph:\n%s", len(lines), out)
	}
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) == 0 || heavy(f[0]) {
			continue
		}
		for _, imp := range f[1:] {
			if heavy(imp) {
				t.Errorf("%s imports %s: the watcher must not link it (see heavyPackages)", f[0], imp)
			}
		}
	}
}
