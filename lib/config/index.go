package config

import (
	"bytes"
	"cmp"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2/unstable"
)

// index maps the key paths written in a document to where they are, so
// that validation errors about well-formed TOML can name a line. The decoder
// only gives positions for its own errors.
type index map[string]entry

type entry struct {
	path []string
	line int
	raw  string // the value as written (TOML syntax); "" for table headers
	kind string // TOML kind in lowercase ("string", "integer", "table", ...)
}

func pathKey(path []string) string { return strings.Join(path, "\x00") }

func (idx index) lookup(path []string) (entry, bool) {
	e, ok := idx[pathKey(path)]
	return e, ok
}

// sorted returns the entries in document order.
func (idx index) sorted() []entry {
	out := make([]entry, 0, len(idx))
	for _, e := range idx {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b entry) int {
		return cmp.Or(cmp.Compare(a.line, b.line), cmp.Compare(pathKey(a.path), pathKey(b.path)))
	})
	return out
}

// buildIndex walks the document with go-toml's expression parser. On a
// syntax error it returns what it found before it: the decoder reports the
// error itself.
func buildIndex(data []byte) index {
	idx := index{}
	b := &indexBuilder{idx: idx}
	b.p.Reset(data)
	var table []string
	for b.p.NextExpression() {
		e := b.p.Expression()
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			table = keyParts(e)
			first := e.Key()
			first.Next()
			b.add(table, b.line(first.Node().Raw), "", "table")
		case unstable.KeyValue:
			b.keyValue(table, e)
		}
	}
	return idx
}

type indexBuilder struct {
	p   unstable.Parser
	idx index
}

func (b *indexBuilder) add(path []string, line int, raw, kind string) {
	b.idx[pathKey(path)] = entry{path: path, line: line, raw: raw, kind: kind}
}

func (b *indexBuilder) line(r unstable.Range) int { return b.p.Shape(r).Start.Line }

// keyValue indexes "key = value" under prefix, and the elements of array
// and inline-table values under it.
func (b *indexBuilder) keyValue(prefix []string, kv *unstable.Node) {
	path := append(slices.Clip(prefix), keyParts(kv)...)
	it := kv.Key()
	it.Next()
	line := b.line(it.Node().Raw)
	last := it.Node()
	for it.Next() {
		last = it.Node()
	}
	// The key-value's range covers "key = value"; the value is what follows
	// the last key part and the '='. (Array nodes carry no range of their
	// own.)
	end := kv.Raw.Offset + kv.Raw.Length
	start := last.Raw.Offset + last.Raw.Length
	raw := ""
	if kv.Raw.Length > 0 && start <= end {
		raw = string(bytes.TrimLeft(b.p.Data()[start:end], " \t="))
	}
	v := kv.Value()
	b.add(path, line, raw, strings.ToLower(v.Kind.String()))
	b.value(path, line, v)
}

func (b *indexBuilder) value(path []string, line int, v *unstable.Node) {
	switch v.Kind {
	case unstable.Array:
		it := v.Children()
		for i := 0; it.Next(); i++ {
			n := it.Node()
			p, l, raw := elem(path, i), line, ""
			if n.Raw.Length > 0 {
				l, raw = b.line(n.Raw), string(b.p.Raw(n.Raw))
			}
			b.add(p, l, raw, strings.ToLower(n.Kind.String()))
			b.value(p, l, n)
		}
	case unstable.InlineTable:
		it := v.Children()
		for it.Next() {
			if n := it.Node(); n.Kind == unstable.KeyValue {
				b.keyValue(path, n)
			}
		}
	}
}

func keyParts(n *unstable.Node) []string {
	var parts []string
	it := n.Key()
	for it.Next() {
		parts = append(parts, string(it.Node().Data))
	}
	return parts
}
