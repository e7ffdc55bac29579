package testhooks

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDefaultBuildHasNoHooks: a build without the tag (make build, make
// bundle) has the hooks off, and one with it on.
func TestDefaultBuildHasNoHooks(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the package twice")
	}
	for _, c := range []struct {
		tags string
		want string
	}{{"", "false"}, {Tag, "true"}} {
		out, err := exec.Command("go", "list", "-tags="+c.tags, "-f", "{{.GoFiles}}", ".").CombinedOutput()
		if err != nil {
			t.Fatalf("go list -tags=%q: %v\n%s", c.tags, err, out)
		}
		file := map[string]string{"false": "off.go", "true": "on.go"}[c.want]
		if !strings.Contains(string(out), file) {
			t.Errorf("-tags=%q compiles %s; want %s (Enabled %s)", c.tags, out, file, c.want)
		}
	}
}
