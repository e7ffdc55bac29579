package clitest

import (
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// NewerLayout checks that the invocation args refuses a host root whose
// layout marker names a newer version than this release's: exit 78
// (exitcode.HostUnfit), an error naming the marker file and both versions,
// and nothing under the root prefix created, removed or rewritten. args
// are what the binary needs to get past its own parsing; the prefix, the
// host root and a bus nobody listens on are added here.
func NewerLayout(t *testing.T, name string, run Run, args ...string) {
	t.Helper()
	NoBus(t)
	prefix := t.TempDir()
	base := filepath.Join(prefix, "opt/kubeslot")
	newer := strconv.Itoa(hostroot.LayoutVersion + 1)
	for _, d := range []string{"releases", "state"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(base, hostroot.LayoutFile), []byte(newer+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, prefix)
	code, _, errs := Call(run, "", append(append([]string{}, args...), "--root-prefix", prefix, "--host-root", "/opt/kubeslot")...)
	if code != exitcode.HostUnfit {
		t.Errorf("%s %v on layout %s: exit %d, want %d; stderr %q", name, args, newer, code, exitcode.HostUnfit, errs)
	}
	for _, want := range []string{hostroot.LayoutFile, "layout version " + newer, "understands " + strconv.Itoa(hostroot.LayoutVersion)} {
		if !strings.Contains(errs, want) {
			t.Errorf("%s %v: stderr %q does not say %q", name, args, errs, want)
		}
	}
	if after := snapshot(t, prefix); after != before {
		t.Errorf("%s %v: the refused run changed the root prefix:\nbefore:\n%s\nafter:\n%s", name, args, before, after)
	}
}

// snapshot lists every path under dir with its mode, size and mtime.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		b.WriteString(rel + " " + fi.Mode().String() + " " + strconv.FormatInt(fi.Size(), 10) + " " + fi.ModTime().Format(time.RFC3339Nano) + "\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
