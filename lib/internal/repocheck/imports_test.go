package repocheck

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const module = "github.com/kubeslot/kubeslot/"

// stageApart lists, for a package, the packages it must not depend on, not
// even through another one: each stage package reaches what it shares with
// another stage through a package below both (lib/slot for a slot's life),
// never through the other stage.
var stageApart = map[string][]string{
	"lib/repave":    {"lib/bootstrap"},
	"lib/bootstrap": {"lib/repave"},
	"lib/slot":      {"lib/bootstrap", "lib/repave"},
}

// TestStagesApart fails when a package of stageApart depends on one it
// must not, naming the package in its graph that imports it.
func TestStagesApart(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the dependencies with:", err)
	}
	for pkg, banned := range stageApart {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		// Every package of pkg's graph with its direct imports, one a line.
		cmd := exec.CommandContext(ctx, goBin, "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, module+pkg)
		cmd.Dir = moduleRoot(t)
		out, err := cmd.Output()
		cancel()
		if err != nil {
			if ee, ok := err.(*exec.ExitError); ok {
				t.Fatalf("go list -deps %s: %v\n%s", pkg, err, ee.Stderr)
			}
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) < 5 {
			t.Fatalf("go list -deps %s listed %d packages, want its whole graph:\n%s", pkg, len(lines), out)
		}
		for _, l := range lines {
			f := strings.Fields(l)
			for _, imp := range f[1:] {
				for _, b := range banned {
					if imp == module+b {
						t.Errorf("%s depends on %s (%s imports it); what the two stages share belongs in a package below both, such as lib/slot",
							pkg, b, strings.TrimPrefix(f[0], module))
					}
				}
			}
		}
	}
}

// TestLockThroughDriver: the stage prologue (ownership.Begin: the
// installation lock, then admission) is taken only through the stage driver
// (stagekit.Driver.Begin), which holds it for the run and releases it at
// Close; stage packages get it as a Begin dependency. Tests may call it.
func TestLockThroughDriver(t *testing.T) {
	root := moduleRoot(t)
	calls := 0
	for _, dir := range []string{"lib", "cmd"} {
		for _, f := range goFiles(t, root, dir) {
			rel, _ := filepath.Rel(root, f)
			if strings.HasSuffix(f, "_test.go") || strings.HasPrefix(rel, "lib/ownership/") {
				continue
			}
			for i, l := range readLines(t, f) {
				if !strings.Contains(l, "ownership.Begin(") || strings.HasPrefix(strings.TrimSpace(l), "//") {
					continue
				}
				if rel == "lib/stagekit/stagekit.go" {
					calls++
					continue
				}
				t.Errorf("%s:%d calls ownership.Begin: take the lock through the stage driver (stagekit.Driver.Begin)", rel, i+1)
			}
		}
	}
	if calls != 1 {
		t.Errorf("lib/stagekit/stagekit.go calls ownership.Begin %d times, want once (the driver's Begin)", calls)
	}
}
