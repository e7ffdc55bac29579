package rig

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// KubeslotBins builds every kubeslot binary once per test binary, into a
// directory tests bind into their isolated hosts.
var KubeslotBins = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "kubeslot-bins-")
	if err != nil {
		return "", err
	}
	binsDir = dir
	cmd := exec.Command("go", "build", "-tags=kubeslot_testhooks", "-o", dir+"/", "./cmd/...")
	cmd.Dir = moduleRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", &buildError{out: string(out), err: err}
	}
	return dir, nil
})

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string { return "go build ./cmd/...: " + e.err.Error() + "\n" + e.out }

// binsDir is where KubeslotBins built, once it ran.
var binsDir string

// removeBins deletes the built binaries, if any were built (TestMain).
func removeBins() {
	if binsDir != "" {
		os.RemoveAll(binsDir)
	}
}

// NeedBins returns the directory of freshly built kubeslot binaries.
func NeedBins(t *testing.T) string {
	t.Helper()
	dir, err := KubeslotBins()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// moduleRoot is the directory holding go.mod (tests run in integration/).
func moduleRoot() string {
	wd, _ := os.Getwd()
	for d := wd; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
	}
	return wd
}
