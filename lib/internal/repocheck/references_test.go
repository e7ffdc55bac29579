package repocheck

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Comments and prose say why the code is as it is, as it is now. A tracker
// reference or a commit id says neither: the reader has to go elsewhere, and
// what it names is history. These tests keep both out of the production and
// test code under lib/ and cmd/ and out of DESIGN.md.

var (
	// issueRef is a tracker reference: "issue", "issues" or "issue #", in any
	// case, and a number.
	issueRef = regexp.MustCompile(`(?i)\bissues? ?#?\d+`)
	// issueWrapped is a line that ends where a reference wrapped onto the
	// next line starts: "issue" at its end, the number on the next line.
	issueWrapped = regexp.MustCompile(`(?i)\bissues? ?#?$`)
	// hexToken is a run of 7 to 40 lower-case hex digits standing alone: the
	// length of an abbreviated or a full commit id. Longer runs (sha256
	// digests) are no commit ids and do not match.
	hexToken = regexp.MustCompile(`\b[0-9a-f]{7,40}\b`)
	// uuid is removed before hexToken is applied: its groups are hex too.
	uuid = regexp.MustCompile(`\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b`)
)

// TestNoIssueReferences fails naming file:line for every tracker reference
// in a Go file under lib/ or cmd/ (code, strings and comments) and in
// DESIGN.md.
func TestNoIssueReferences(t *testing.T) {
	root := moduleRoot(t)
	for _, dir := range []string{"lib", "cmd"} {
		t.Run(dir, func(t *testing.T) {
			for _, f := range goFiles(t, root, dir) {
				checkIssues(t, root, f, readLines(t, f), goCommentText)
			}
		})
	}
	t.Run("DESIGN.md", func(t *testing.T) {
		f := filepath.Join(root, "DESIGN.md")
		checkIssues(t, root, f, readLines(t, f), strings.TrimSpace)
	})
}

// TestNoCommitIDs fails naming file:line for every token that looks like a
// commit id in the comments of a Go file under lib/ or cmd/ and anywhere in
// DESIGN.md. Only comment lines of Go files are read: hex in test data is
// data.
func TestNoCommitIDs(t *testing.T) {
	root := moduleRoot(t)
	for _, dir := range []string{"lib", "cmd"} {
		t.Run(dir, func(t *testing.T) {
			for _, f := range goFiles(t, root, dir) {
				for i, line := range readLines(t, f) {
					text := strings.TrimSpace(line)
					if !strings.HasPrefix(text, "//") {
						continue
					}
					checkCommitIDs(t, root, f, i+1, text)
				}
			}
		})
	}
	t.Run("DESIGN.md", func(t *testing.T) {
		f := filepath.Join(root, "DESIGN.md")
		for i, line := range readLines(t, f) {
			checkCommitIDs(t, root, f, i+1, line)
		}
	})
}

func checkIssues(t *testing.T, root, file string, lines []string, continuation func(string) string) {
	t.Helper()
	for i, line := range lines {
		if m := issueRef.FindString(line); m != "" {
			t.Errorf("%s:%d: tracker reference %q: say the reason instead", rel(root, file), i+1, m)
			continue
		}
		if issueWrapped.MatchString(strings.TrimSpace(line)) && i+1 < len(lines) {
			next := continuation(lines[i+1])
			if next != "" && next[0] >= '0' && next[0] <= '9' {
				t.Errorf("%s:%d: tracker reference wrapped onto the next line: say the reason instead", rel(root, file), i+1)
			}
		}
	}
}

func checkCommitIDs(t *testing.T, root, file string, n int, text string) {
	t.Helper()
	text = uuid.ReplaceAllString(text, "")
	for _, m := range hexToken.FindAllString(text, -1) {
		if looksLikeCommitID(m) {
			t.Errorf("%s:%d: %q looks like a commit id: say what is true now instead", rel(root, file), n, m)
		}
	}
}

// looksLikeCommitID: a commit id mixes digits and letters; a run of digits
// alone is a number, and of letters alone a word ("defaced").
func looksLikeCommitID(s string) bool {
	return strings.ContainsAny(s, "0123456789") && strings.ContainsAny(s, "abcdef")
}

// goCommentText is a Go line without its indentation and comment marker,
// for the line a wrapped reference continues on.
func goCommentText(line string) string {
	return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "//"))
}

// moduleRoot is the nearest directory at or above the test's own that holds
// go.mod.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		} else if !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod at or above the test's directory")
		}
		dir = parent
	}
}

// goFiles lists the *.go files under root/dir.
func goFiles(t *testing.T, root, dir string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no Go files under %s: the check would pass vacuously", dir)
	}
	return files
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), len(data)+1)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(fmt.Errorf("%s: %w", path, err))
	}
	return lines
}

func rel(root, path string) string {
	if r, err := filepath.Rel(root, path); err == nil {
		return r
	}
	return path
}

// TestDesignSize: DESIGN.md says what is true now and why; history lives in
// commit messages and figures come from make bench, so it stays short
// enough to be read whole.
func TestDesignSize(t *testing.T) {
	const limit = 45_000
	fi, err := os.Stat(filepath.Join(moduleRoot(t), "DESIGN.md"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > limit {
		t.Errorf("DESIGN.md is %d bytes, over %d: cut a diary, not a rule", fi.Size(), limit)
	}
}
