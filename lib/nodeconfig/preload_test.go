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

// preloadRun runs the preload script with a fake ctr over one temporary
// records directory; run returns the calls it logged.
type preloadRun struct {
	t                     *testing.T
	sh, script, list, bin string
	records, images, log  string
	env                   []string
}

func newPreloadRun(t *testing.T) *preloadRun {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh:", err)
	}
	dir := t.TempDir()
	r := &preloadRun{t: t, sh: sh, bin: filepath.Join(dir, "bin"), script: filepath.Join(dir, "preload.sh"),
		list: filepath.Join(dir, "preload.list"), records: filepath.Join(dir, "records"),
		images: filepath.Join(dir, "images"), log: filepath.Join(dir, "ctr.log")}
	r.write(filepath.Join(r.bin, "ctr"), fakeCtr, 0o755)
	r.write(r.script, string(preloadScript), 0o755)
	r.write(r.images, "", 0o644)
	return r
}

func (r *preloadRun) write(p, s string, mode os.FileMode) {
	r.t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), mode); err != nil {
		r.t.Fatal(err)
	}
}

// run runs the script over archives, with the marker argument complete
// when it is not "".
func (r *preloadRun) run(complete string, archives ...string) (string, error) {
	r.t.Helper()
	r.write(r.list, strings.Join(archives, "\n")+"\n", 0o644)
	r.write(r.log, "", 0o644)
	args := []string{r.script, r.list, r.records}
	if complete != "" {
		args = append(args, complete)
	}
	cmd := exec.CommandContext(r.t.Context(), r.sh, args...)
	cmd.Env = append(append(os.Environ(), "PATH="+r.bin+":"+os.Getenv("PATH"), "CTR_LOG="+r.log, "IMAGES="+r.images,
		"CONTAINERD_SNAPSHOTTER=native"), r.env...)
	out, err := cmd.CombinedOutput()
	calls, _ := os.ReadFile(r.log)
	if err != nil {
		err = fmt.Errorf("%w\n%s", err, out)
	}
	return strings.TrimSpace(string(calls)), err
}

const (
	named, bare = "/var/lib/kubeslot/cache/sha256/named", "/var/lib/kubeslot/cache/sha256/bare"
	lsImages    = "--namespace k8s.io images ls -q"
)

func importOf(f string) string { return "--namespace k8s.io images import " + f }

// TestPreloadScript runs the preload script with a fake ctr: an archive
// whose images are all there already is skipped, one whose import named no
// image or whose image went is imported again, and a failed import fails it.
func TestPreloadScript(t *testing.T) {
	r := newPreloadRun(t)
	for i, c := range []struct {
		before func()
		want   []string
	}{
		{nil, []string{importOf(named), importOf(bare)}},                                               // first start: both imported
		{nil, []string{lsImages, importOf(bare)}},                                                      // named skipped; bare named no image
		{func() { r.write(r.images, "", 0o644) }, []string{lsImages, importOf(named), importOf(bare)}}, // its image went
	} {
		if c.before != nil {
			c.before()
		}
		calls, err := r.run("", named, bare)
		if err != nil {
			t.Fatalf("run %d: %v", i+1, err)
		}
		if want := strings.Join(c.want, "\n"); calls != want {
			t.Errorf("run %d: ctr calls\n%s\nwant\n%s", i+1, calls, want)
		}
	}
	if _, err := os.Stat(filepath.Join(r.records, "native_var_lib_kubeslot_cache_sha256_named")); err != nil {
		t.Errorf("no record of the named archive under the snapshotter's key: %v", err)
	}
	if _, err := r.run("", named, "/x/broken", bare); err == nil {
		t.Error("a failed import did not fail the preload")
	}
}

// TestPreloadMarksComplete: the marker is there once every archive has its
// record (the unit before the kubelet is then skipped), not while one
// archive's import named no image, and a failed run removes it.
func TestPreloadMarksComplete(t *testing.T) {
	r := newPreloadRun(t)
	complete := filepath.Join(r.records, "complete-x")
	marked := func() bool { _, err := os.Stat(complete); return err == nil }
	if _, err := r.run(complete, named); err != nil || !marked() {
		t.Fatalf("first import: marked %v, err %v", marked(), err)
	}
	if calls, err := r.run(complete, named); err != nil || !marked() || calls != lsImages {
		t.Errorf("the check beside the kubelet: marked %v, calls %q, err %v", marked(), calls, err)
	}
	if _, err := r.run(complete, named, bare); err != nil || marked() {
		t.Errorf("an archive that named no image: marked %v, err %v", marked(), err)
	}
	if _, err := r.run(complete, named); err != nil || !marked() {
		t.Fatalf("marked again: %v, err %v", marked(), err)
	}
	if _, err := r.run(complete, named, "/x/broken"); err == nil || marked() {
		t.Errorf("a failed import: marked %v, err %v", marked(), err)
	}
}
