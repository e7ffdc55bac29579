package atomicfile

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestWriteFileReplacesAndSetsMode(t *testing.T) {
	old := syscall.Umask(0o077) // perm must win over the umask
	defer syscall.Umask(old)
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	for _, content := range []string{"one", "two"} {
		if err := WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil || string(got) != content {
			t.Fatalf("got %q %v, want %q", got, err, content)
		}
	}
	fi, _ := os.Stat(p)
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644", fi.Mode().Perm())
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("temporary files left behind: %v", ents)
	}
}

func TestWriteFileMissingDirectory(t *testing.T) {
	p := filepath.Join(t.TempDir(), "missing", "f")
	if err := WriteFile(p, []byte("x"), 0o600); err == nil {
		t.Fatal("write into a missing directory succeeded")
	}
}

func TestRenameAndRemove(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "sub", "b")
	if err := os.Mkdir(filepath.Dir(b), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(a, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Rename(a, b); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(b); err != nil {
		t.Fatal(err)
	}
	if err := Rename(a, b); err == nil {
		t.Fatal("renaming a claimed file twice succeeded: two workers could both claim it")
	}
	if err := Remove(b); err != nil {
		t.Fatal(err)
	}
	if err := Remove(b); err != nil {
		t.Fatalf("removing an absent file: %v", err)
	}
}

// CopyFile replaces the target with the whole copy in the mode asked past
// the umask, refuses a source over the limit leaving the target as it was,
// and leaves no temporary file either way.
func TestCopyFileBoundedAndAtomic(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	if err := os.WriteFile(src, []byte("12345"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := CopyFile(src, dst, 0o755, 5); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(dst); string(b) != "12345" {
		t.Errorf("copy holds %q", b)
	}
	if fi, err := os.Stat(dst); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("copy mode %v, %v; want 0755", fi.Mode(), err)
	}
	if err := os.WriteFile(src, []byte("123456"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := CopyFile(src, dst, 0o755, 5); err == nil || !strings.Contains(err.Error(), "larger than 5 bytes") {
		t.Errorf("copy over the limit: %v", err)
	}
	if b, _ := os.ReadFile(dst); string(b) != "12345" {
		t.Errorf("a refused copy changed the target: %q", b)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Errorf("left behind: %v", ents)
	}
}

// Symlink replaces a link (never following it) and a stale temporary link
// from a crash, and leaves no temporary link.
func TestSymlinkReplaces(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "current")
	if err := os.Symlink("releases/blue", p); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("stale", filepath.Join(dir, ".current.tmp")); err != nil {
		t.Fatal(err)
	}
	if err := Symlink("releases/green", p); err != nil {
		t.Fatal(err)
	}
	if got, err := os.Readlink(p); err != nil || got != "releases/green" {
		t.Errorf("link -> %q, %v", got, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("left behind: %v", ents)
	}
}
