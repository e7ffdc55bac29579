package testkit

import (
	"os"
	"path/filepath"
	"testing"
)

// Tree tells content, mode and link target apart, leaves a volatile file's
// content out but not its presence; TreeDiff names each difference.
func TestTree(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, content string, mode os.FileMode) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, rel), []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(dir, rel), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("f", "one", 0o644)
	write("lock", "held by a", 0o600)
	if err := os.Symlink("f", filepath.Join(dir, "l")); err != nil {
		t.Fatal(err)
	}
	before := Tree(t, dir, "lock")
	if d := TreeDiff(before, Tree(t, dir, "lock")); d != "" {
		t.Errorf("an unchanged tree differs: %s", d)
	}
	write("lock", "held by b", 0o600)
	if d := TreeDiff(before, Tree(t, dir, "lock")); d != "" {
		t.Errorf("volatile content counted: %s", d)
	}
	write("f", "two", 0o644)
	os.Remove(filepath.Join(dir, "l"))
	write("new", "", 0o644)
	want := "+ new\n- l\n~ f: " + before["f"] + " => " + Tree(t, dir)["f"]
	if d := TreeDiff(before, Tree(t, dir, "lock")); d != want {
		t.Errorf("diff:\n%s\nwant:\n%s", d, want)
	}
	write("f", "one", 0o600)
	if d := TreeDiff(before, Tree(t, dir, "lock")); d == "" || Tree(t, dir)["f"] == before["f"] {
		t.Error("a mode change went unseen")
	}
}
