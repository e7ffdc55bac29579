package rig

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/integration/kube"
)

// BuildKubeslot builds the CLI into a test's temporary directory (the build cache makes the second build quick).
func BuildKubeslot(t *testing.T) string {
	t.Helper()
	t0 := time.Now()
	bin := filepath.Join(t.TempDir(), "kubeslot")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/kubeslot/kubeslot/cmd/kubeslot").CombinedOutput()
	if err != nil {
		t.Fatalf("go build ./cmd/kubeslot: %v\n%s", err, out)
	}
	t.Logf("timing: build kubeslot %.1fs", time.Since(t0).Seconds())
	return bin
}

// RunCLI runs `kubeslot args...` with the admin kubeconfig and returns stdout, stderr and the exit code.
func RunCLI(t *testing.T, ctx context.Context, cp *kube.ControlPlane, bin string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cp.AdminKubeconfig(), "HOME="+t.TempDir())
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubeslot %s: exit %d\nstdout:\n%sstderr:\n%s", strings.Join(args, " "), code, stdout.String(), stderr.String())
	return stdout.String(), stderr.String(), code
}
