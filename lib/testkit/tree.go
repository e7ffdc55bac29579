package testkit

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Tree describes every entry under dir (dir itself is "."), by its path
// relative to dir: its type and mode, and a link's target or a regular
// file's sha256. The content of the volatile paths (relative, such as the
// lock file, whose content says who held it last) is left out; their
// presence and mode still count. Two trees are the same host state when
// their maps are equal.
func Tree(t testing.TB, dir string, volatile ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		v := fi.Mode().String()
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			v += " -> " + target
		case fi.Mode().IsRegular() && !slices.Contains(volatile, rel):
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += fmt.Sprintf(" %x", sha256.Sum256(b))
		}
		out[rel] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TreeDiff lists, sorted, the paths that went ("- p"), changed ("~ p") and
// came ("+ p") from tree a to tree b; "" when they are the same.
func TreeDiff(a, b map[string]string) string {
	var lines []string
	for k, v := range a {
		if w, ok := b[k]; !ok {
			lines = append(lines, "- "+k)
		} else if w != v {
			lines = append(lines, "~ "+k+": "+v+" => "+w)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			lines = append(lines, "+ "+k)
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}
