package nodeconfig

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeCtr is a ctr that logs its arguments, lists the images in $IMAGES,
// and imports an archive named *named (one image, reg/a:1), *bare (no
// name) or *broken (fails).
const fakeCtr = `#!/bin/sh
echo "$*" >> "$CTR_LOG"
case "$*" in
*"images ls -q") cat "$IMAGES" ;;
*"images import "*named) echo "unpacking reg/a:1 (sha256:11)...done"; echo reg/a:1 >> "$IMAGES" ;;
*"images import "*bare) echo "done" ;;
*"images import "*broken) echo "ctr: no such archive" >&2; exit 1 ;;
*) exit 2 ;;
esac
`

// TestPreloadScript runs the preload script with a fake ctr: an archive
// whose images are all there already is skipped, one whose import named no
// image or whose image went is imported again, and a failed import fails it.
func TestPreloadScript(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh:", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	write := func(p, s string, mode os.FileMode) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), mode); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(bin, "ctr"), fakeCtr, 0o755)
	script, list, records := filepath.Join(dir, "preload.sh"), filepath.Join(dir, "preload.list"), filepath.Join(dir, "records")
	images, log := filepath.Join(dir, "images"), filepath.Join(dir, "ctr.log")
	write(script, string(preloadScript), 0o755)
	write(images, "", 0o644)
	run := func(archives ...string) (string, error) {
		t.Helper()
		write(list, strings.Join(archives, "\n")+"\n", 0o644)
		write(log, "", 0o644)
		cmd := exec.CommandContext(t.Context(), sh, script, list, records)
		cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "CTR_LOG="+log, "IMAGES="+images, "CONTAINERD_SNAPSHOTTER=native")
		out, err := cmd.CombinedOutput()
		calls, _ := os.ReadFile(log)
		if err != nil {
			err = fmt.Errorf("%w\n%s", err, out)
		}
		return strings.TrimSpace(string(calls)), err
	}
	const named, bare = "/var/lib/kubeslot/cache/sha256/named", "/var/lib/kubeslot/cache/sha256/bare"
	importOf := func(f string) string { return "--namespace k8s.io images import " + f }
	const lsImages = "--namespace k8s.io images ls -q"

	for i, c := range []struct {
		before func()
		want   []string
	}{
		{nil, []string{importOf(named), importOf(bare)}},                                           // first start: both imported
		{nil, []string{lsImages, importOf(bare)}},                                                  // named skipped; bare named no image
		{func() { write(images, "", 0o644) }, []string{lsImages, importOf(named), importOf(bare)}}, // its image went
	} {
		if c.before != nil {
			c.before()
		}
		calls, err := run(named, bare)
		if err != nil {
			t.Fatalf("run %d: %v", i+1, err)
		}
		if want := strings.Join(c.want, "\n"); calls != want {
			t.Errorf("run %d: ctr calls\n%s\nwant\n%s", i+1, calls, want)
		}
	}
	if _, err := os.Stat(filepath.Join(records, "native_var_lib_kubeslot_cache_sha256_named")); err != nil {
		t.Errorf("no record of the named archive under the snapshotter's key: %v", err)
	}
	if _, err := run(named, "/x/broken", bare); err == nil {
		t.Error("a failed import did not fail the preload")
	}
}
