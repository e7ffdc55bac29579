package config

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2/unstable"
)

// tokenPath is the key path of the join token in the document.
var tokenPath = []string{"cluster", "bootstrap_token"}

// RemoveJoinToken returns data, the text of a bootstrap configuration, with
// its join token (cluster.bootstrap_token) taken out and every other byte,
// comments and layout included, as it was: the reset keeps the operator's
// configuration for a later bootstrap, but a reset host must not keep a
// credential that can join a cluster.
//
// A token written as its own line ("bootstrap_token = ..." under [cluster],
// or "cluster.bootstrap_token = ..." at the top) is replaced, in place, by
// the comment "# " + note; one inside an inline table (cluster = {...}),
// where TOML allows no comment, by an empty string. Either way the result
// still parses, with no join credential: enough for a node that keeps its
// identity, while a join then fails asking for a fresh token.
//
// It works on the text alone, so it needs no valid configuration, only valid
// TOML: on a syntax error it returns the error, naming the line but no value.
// removed is false, and out is data, when there is no token.
func RemoveJoinToken(data []byte, note string) (out []byte, removed bool, err error) {
	if strings.ContainsAny(note, "\r\n") {
		return nil, false, errors.New("config: the note that replaces the join token must be one line")
	}
	spans, err := tokenSpans(data)
	if err != nil {
		return nil, false, err
	}
	spans = slices.DeleteFunc(spans, span.done)
	if len(spans) == 0 {
		return data, false, nil
	}
	out = slices.Clone(data)
	// From the last to the first, so the earlier offsets stay right.
	for i := len(spans) - 1; i >= 0; i-- {
		s := spans[i]
		repl := []byte(`""`)
		if s.line {
			repl = []byte("# " + note)
		}
		out = slices.Concat(out[:s.from], repl, out[s.to:])
	}
	// What is left must be TOML without a token, or the edit was wrong.
	if left, err := tokenSpans(out); err != nil || slices.ContainsFunc(left, func(s span) bool { return !s.done() }) {
		return nil, false, fmt.Errorf("config: removing the join token left an unexpected document (%v): nothing changed", err)
	}
	return out, true, nil
}

// span is where a token key-value (line) or a token value inside an inline
// table (!line) is, as byte offsets; empty: that value is already "".
type span struct {
	from, to    int
	line, empty bool
}

// done: nothing secret is left there (an inline value already "").
func (s span) done() bool { return !s.line && s.empty }

// tokenSpans finds every key-value at or below tokenPath. TOML forbids a key
// twice, so there is one at most, or several only for a dotted key that
// makes a table of the token (cluster.bootstrap_token.x = ...), which Parse
// refuses but which may hold the secret all the same.
func tokenSpans(data []byte) ([]span, error) {
	var p unstable.Parser
	p.Reset(data)
	var table []string
	var spans []span
	for p.NextExpression() {
		e := p.Expression()
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			table = keyParts(e)
			if underToken(table) {
				// [cluster.bootstrap_token]: a table Parse refuses; its
				// key-values are caught below.
				continue
			}
		case unstable.KeyValue:
			path := append(slices.Clip(table), keyParts(e)...)
			if underToken(path) {
				spans = append(spans, span{from: int(e.Raw.Offset), to: int(e.Raw.Offset + e.Raw.Length), line: true})
				continue
			}
			in, err := inlineTokens(path, e.Value())
			if err != nil {
				return nil, err
			}
			spans = append(spans, in...)
		}
	}
	if err := p.Error(); err != nil {
		var perr *unstable.ParserError
		if errors.As(err, &perr) {
			return nil, fmt.Errorf("config: not valid TOML at line %d: %s", p.Shape(p.Range(perr.Highlight)).Start.Line, perr.Message)
		}
		return nil, fmt.Errorf("config: not valid TOML: %w", err)
	}
	return spans, nil
}

// inlineTokens finds the token's value inside v, the value of the key path,
// when v is an inline table that holds it (cluster = {bootstrap_token = ...}).
func inlineTokens(path []string, v *unstable.Node) ([]span, error) {
	if v.Kind != unstable.InlineTable || len(path) >= len(tokenPath) {
		return nil, nil
	}
	var out []span
	it := v.Children()
	for it.Next() {
		kv := it.Node()
		if kv.Kind != unstable.KeyValue {
			continue
		}
		sub := append(slices.Clip(path), keyParts(kv)...)
		val := kv.Value()
		switch {
		case !underToken(sub):
			in, err := inlineTokens(sub, val)
			if err != nil {
				return nil, err
			}
			out = append(out, in...)
		case val.Kind == unstable.String && val.Raw.Length > 0:
			out = append(out, span{from: int(val.Raw.Offset), to: int(val.Raw.Offset + val.Raw.Length), empty: len(val.Data) == 0})
		default:
			// Parse refuses such a token, so no bootstrap ran with it; it
			// may hold the secret all the same, and an inline table has no
			// place for a comment.
			return nil, fmt.Errorf("config: %s in an inline table is a %s, not a string: remove it by hand", strings.Join(sub, "."), strings.ToLower(val.Kind.String()))
		}
	}
	return out, nil
}

// underToken reports whether path is tokenPath or a path below it.
func underToken(path []string) bool {
	return len(path) >= len(tokenPath) && slices.Equal(path[:len(tokenPath)], tokenPath)
}

// HasJoinToken reports whether the text of a configuration holds a join
// token that RemoveJoinToken would remove (a syntax error is an error).
func HasJoinToken(data []byte) (bool, error) {
	spans, err := tokenSpans(data)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(spans, func(s span) bool { return !s.done() }), nil
}
