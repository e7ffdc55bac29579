package config

import (
	"testing"
)

func TestIndex(t *testing.T) {
	doc := `# comment
top = 1
machine.name = "m"     # dotted key at the top level

[kubernetes]
version = "1.37.2"
taints = [
  "a:NoSchedule",  # first
  'b:NoExecute',
]
labels = { zone = "z", "example.com/role" = "r" }
"quoted key" = true

[artifacts.kubelet]
url = "/srv/kubelet"
`
	idx := buildIndex([]byte(doc))
	cases := []struct {
		path []string
		line int
		raw  string
		kind string
	}{
		{[]string{"top"}, 2, "1", "integer"},
		{[]string{"machine", "name"}, 3, `"m"`, "string"},
		{[]string{"kubernetes"}, 5, "", "table"},
		{[]string{"kubernetes", "version"}, 6, `"1.37.2"`, "string"},
		{[]string{"kubernetes", "taints"}, 7, "[\n  \"a:NoSchedule\",  # first\n  'b:NoExecute',\n]", "array"},
		{elem([]string{"kubernetes", "taints"}, 0), 8, `"a:NoSchedule"`, "string"},
		{elem([]string{"kubernetes", "taints"}, 1), 9, `'b:NoExecute'`, "string"},
		{[]string{"kubernetes", "labels", "zone"}, 11, `"z"`, "string"},
		{[]string{"kubernetes", "labels", "example.com/role"}, 11, `"r"`, "string"},
		{[]string{"kubernetes", "quoted key"}, 12, "true", "bool"},
		{[]string{"artifacts", "kubelet"}, 14, "", "table"},
		{[]string{"artifacts", "kubelet", "url"}, 15, `"/srv/kubelet"`, "string"},
	}
	for _, c := range cases {
		e, ok := idx.lookup(c.path)
		if !ok {
			t.Errorf("%s: not indexed", keyString(c.path))
			continue
		}
		if e.line != c.line || e.raw != c.raw || e.kind != c.kind {
			t.Errorf("%s: got line %d raw %q kind %s, want line %d raw %q kind %s",
				keyString(c.path), e.line, e.raw, e.kind, c.line, c.raw, c.kind)
		}
	}
	if _, ok := idx.lookup([]string{"kubernetes", "missing"}); ok {
		t.Error("lookup found a key that is not in the document")
	}

	// A syntax error keeps what came before it.
	partial := buildIndex([]byte("a = 1\nb = \nc = 3\n"))
	if _, ok := partial.lookup([]string{"a"}); !ok {
		t.Error("partial index lost the key before the error")
	}
}

func TestKeyString(t *testing.T) {
	cases := map[string][]string{
		"cluster.server":                       {"cluster", "server"},
		`kubernetes.labels."example.com/zone"`: {"kubernetes", "labels", "example.com/zone"},
		"kubernetes.taints[2]":                 elem([]string{"kubernetes", "taints"}, 2),
		`kubernetes.labels."with space"`:       {"kubernetes", "labels", "with space"},
		`kubernetes.labels."quote\"in"`:        {"kubernetes", "labels", `quote"in`},
		"":                                     nil,
	}
	for want, path := range cases {
		if got := keyString(path); got != want {
			t.Errorf("keyString(%q) = %q, want %q", path, got, want)
		}
	}
}
