package ignition

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// upstreamModule is Ignition's config package and everything below it:
// only the kubeslot CLI, which writes Ignition configs, may link it. The
// binaries on the host have no use for it, and every MB they link is mapped
// into every host (DESIGN.md, "The watcher's memory").
const upstreamModule = "github.com/coreos/ignition/v2"

// TestOnlyTheCLILinksIgnition lists every binary's transitive imports and
// fails when one other than cmd/kubeslot has Ignition's package in them.
func TestOnlyTheCLILinksIgnition(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the dependencies with:", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	// One line per binary: its import path, then all it depends on.
	out, err := exec.CommandContext(ctx, goBin, "list", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, "../../cmd/...").Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	binaries := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		binaries++
		links := false
		for _, dep := range f[1:] {
			links = links || strings.HasPrefix(dep, upstreamModule+"/")
		}
		cli := f[0] == "github.com/kubeslot/kubeslot/cmd/kubeslot"
		switch {
		case cli && !links:
			t.Errorf("%s does not link %s: is Check still Ignition's validation?", f[0], upstreamModule)
		case !cli && links:
			t.Errorf("%s links %s: only the CLI may (see upstreamModule)", f[0], upstreamModule)
		}
	}
	if binaries < 6 {
		t.Fatalf("go list named %d binaries, want every cmd/:\n%s", binaries, out)
	}
}
