package config

import (
	"errors"
	"strings"
	"testing"
)

// testToken is the token in minimal and in Example; tests search every
// output for it.
const testToken = "abcdef.0123456789abcdef"

// minimal is the smallest valid configuration. Tests edit it with with and
// without rather than repeating it.
const minimal = `[machine]
name = "worker-1"

[cluster]
server = "https://203.0.113.10:6443"
ca_file = "/etc/kubeslot/ca.crt"
bootstrap_token = "abcdef.0123456789abcdef"

[kubernetes]
version = "1.37.2"

[rootfs]
source = "https://images.example.com/rootfs.tar.zst"
sha256 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

[artifacts.kubelet]
url = "https://dl.k8s.io/release/v1.37.2/bin/linux/amd64/kubelet"
sha256 = "1111111111111111111111111111111111111111111111111111111111111111"
`

// with sets line ("key = value") in [table] of doc: it replaces the line
// that sets the same key there, or adds it after the header, or adds the
// table at the end. Table "" is the top level.
func with(doc, table, line string) string {
	key, _, _ := strings.Cut(line, "=")
	key = strings.TrimSpace(key)
	lines := strings.Split(doc, "\n")
	start, end := tableSpan(lines, table)
	if start < 0 {
		return strings.TrimRight(doc, "\n") + "\n\n[" + table + "]\n" + line + "\n"
	}
	for i := start; i < end; i++ {
		if k, _, ok := strings.Cut(lines[i], "="); ok && strings.TrimSpace(k) == key {
			lines[i] = line
			return strings.Join(lines, "\n")
		}
	}
	lines = append(lines[:start], append([]string{line}, lines[start:]...)...)
	return strings.Join(lines, "\n")
}

// without removes the line setting key in [table].
func without(doc, table, key string) string {
	lines := strings.Split(doc, "\n")
	start, end := tableSpan(lines, table)
	for i := start; i >= 0 && i < end; i++ {
		if k, _, ok := strings.Cut(lines[i], "="); ok && strings.TrimSpace(k) == key {
			return strings.Join(append(lines[:i], lines[i+1:]...), "\n")
		}
	}
	panic("without: no " + table + "." + key + " in doc")
}

// tableSpan returns the lines [start, end) of the body of table, or -1.
func tableSpan(lines []string, table string) (start, end int) {
	start = -1
	if table == "" {
		start = 0
	}
	for i, l := range lines {
		if strings.HasPrefix(l, "[") {
			if start >= 0 {
				return start, i
			}
			if l == "["+table+"]" {
				start = i + 1
			}
		}
	}
	return start, len(lines)
}

// lineOf returns the 1-based line of the first line of doc containing text.
func lineOf(t *testing.T, doc, text string) int {
	t.Helper()
	for i, l := range strings.Split(doc, "\n") {
		if strings.Contains(l, text) {
			return i + 1
		}
	}
	t.Fatalf("no line contains %q in\n%s", text, doc)
	return 0
}

func mustParse(t *testing.T, doc string) *Config {
	t.Helper()
	cfg, err := Parse("test.toml", []byte(doc))
	if err != nil {
		t.Fatalf("Parse:\n%v\ndocument:\n%s", err, doc)
	}
	return cfg
}

// parseErrors parses a document that must fail and returns its errors.
func parseErrors(t *testing.T, doc string) Errors {
	t.Helper()
	cfg, err := Parse("test.toml", []byte(doc))
	if err == nil {
		t.Fatalf("Parse succeeded, want errors; document:\n%s", doc)
	}
	if cfg != nil {
		t.Errorf("Parse returned a config along with errors")
	}
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Parse error is %T, want Errors: %v", err, err)
	}
	return errs
}
