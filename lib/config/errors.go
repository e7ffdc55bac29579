package config

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// Error is one problem in a configuration. Its Error method gives one line
// such as
//
//	config.toml:12: cluster.server = "ftp://x": must be an https URL with a host
type Error struct {
	File string // as given to Parse or Load; empty for Validate
	// Key is the key path: cluster.server, kubernetes.taints[1],
	// kubernetes.labels."example.com/zone".
	Key  string
	Line int // 1-based; 0 when the key is not in the file (missing)
	// Value is the offending value as it would be written in TOML (strings
	// quoted, long values clipped). Empty when not useful; "[redacted]" for
	// secrets, which are never shown.
	Value string
	Msg   string // what is wrong, and what is allowed

	path    []string // Key as parts, to find the line
	missing bool     // a required value is empty
	detail  string   // what to set, for a missing value
}

func (e *Error) Error() string {
	var b strings.Builder
	switch {
	case e.File != "" && e.Line > 0:
		fmt.Fprintf(&b, "%s:%d: ", e.File, e.Line)
	case e.File != "":
		b.WriteString(e.File + ": ")
	case e.Line > 0:
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Key != "" {
		b.WriteString(e.Key)
		if e.Value != "" {
			b.WriteString(" = " + e.Value)
		}
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors is every problem found in one configuration. Parse returns them
// sorted by line, keys missing from the file last; Validate in the order
// of the sections.
type Errors []*Error

// Error gives one problem per line.
func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap lets errors.As find each *Error.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

func newError(path []string, value, format string, args ...any) *Error {
	return &Error{Key: keyString(path), Value: value, Msg: fmt.Sprintf(format, args...), path: path}
}

// missingError reports an empty required value; detail says what to set
// when more than "this key" is needed.
func missingError(path []string, detail string) *Error {
	e := newError(path, "", "%s", "missing (required)")
	if detail != "" {
		e.Msg = "missing: " + detail
	}
	e.missing, e.detail = true, detail
	return e
}

// locate fills in the file name and, from the index, the line of each
// error, and sorts them into file order with missing keys (line 0) last. A
// "missing" value that is in the file after all was written as an empty
// string, and is reported as such. It returns es as an error.
func (es Errors) locate(file string, idx index) error {
	for _, e := range es {
		e.File = file
		// By type: a value at or below a Secret field (a dotted key such as
		// bootstrap_token.value makes a table of it) is never shown.
		if underSecret(e.path) && e.Value != "" {
			e.Value = redacted
		}
		if e.Line > 0 || e.path == nil {
			continue
		}
		ent, ok := idx.lookup(e.path)
		if !ok {
			continue
		}
		e.Line = ent.line
		if e.missing {
			e.Value = clip(ent.raw)
			e.Msg = "must not be empty (required)"
			if e.detail != "" {
				e.Msg = "must not be empty: " + e.detail
			}
		}
	}
	slices.SortStableFunc(es, func(a, b *Error) int {
		return cmp.Compare(sortLine(a), sortLine(b))
	})
	return es
}

func sortLine(e *Error) int {
	if e.Line == 0 {
		return math.MaxInt
	}
	return e.Line
}

// An index part in a key path stands for an array element.
const indexMark = "\x01"

func elem(path []string, i int) []string {
	return append(slices.Clip(path), indexMark+strconv.Itoa(i))
}

var bareKeyRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// keyString writes a key path the way it would appear in a TOML file.
func keyString(path []string) string {
	var b strings.Builder
	for i, p := range path {
		if n, ok := strings.CutPrefix(p, indexMark); ok {
			b.WriteString("[" + n + "]")
			continue
		}
		if i > 0 {
			b.WriteByte('.')
		}
		if bareKeyRE.MatchString(p) {
			b.WriteString(p)
		} else {
			b.WriteString(strconv.Quote(p))
		}
	}
	return b.String()
}

// clip shortens a value for an error line: first line only, at most 80
// characters. PEM blocks and long URLs stay recognisable without flooding
// the terminal.
func clip(s string) string {
	cut := false
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s, cut = s[:i], true
	}
	if r := []rune(s); len(r) > 80 {
		s, cut = string(r[:80]), true
	}
	if cut {
		s += "…"
	}
	return s
}

// quote shows a string value as TOML would.
func quote(s string) string { return strconv.Quote(clip(s)) }

// decodeError turns a syntax or type error from the decoder into an Error.
func decodeError(err error, idx index) *Error {
	var de *toml.DecodeError
	if !errors.As(err, &de) {
		return &Error{Msg: err.Error()}
	}
	line, col := de.Position()
	path := []string(de.Key())
	e := &Error{Key: keyString(path), Line: line, path: path}
	msg := strings.TrimPrefix(de.Error(), "toml: ")
	t, known := fieldType(path)
	showValue := true
	switch {
	case known && t == durationType:
		e.Msg = "invalid duration: " + durationHelp
	case strings.HasPrefix(msg, "cannot decode TOML "):
		// "cannot decode TOML integer into struct field ... of type string":
		// say it in TOML terms rather than Go's.
		kind := strings.Fields(msg)[3]
		e.Msg = fmt.Sprintf("wrong type: got a TOML %s, want %s", kind, describeType(t, known))
	case strings.HasPrefix(msg, "cannot store a table in"), strings.HasPrefix(msg, "cannot store an array table in"):
		e.Msg = fmt.Sprintf("wrong type: got a table, want %s", describeType(t, known))
		showValue = false
	default:
		// Malformed TOML: the library's message and where on the line.
		e.Msg = fmt.Sprintf("%s (column %d)%s", msg, col, syntaxHint(msg))
		showValue = false
	}
	if ent, ok := idx.lookup(path); ok && showValue {
		e.Value = clip(ent.raw)
	}
	if known && t == secretType {
		e.Value = redacted
	}
	return e
}

// syntaxHint adds the likely cause to the parser's message for a value that
// starts with a letter: an unquoted string (mode = nspawn parses as the
// start of the keyword nan).
func syntaxHint(msg string) string {
	if strings.HasPrefix(msg, "expected keyword") ||
		(strings.Contains(msg, "at start of value") && !strings.Contains(msg, "U+000A") && !strings.Contains(msg, "U+000D")) {
		return `; strings need quotes, e.g. mode = "nspawn"`
	}
	return ""
}

// unknownKeyError describes one key strict decoding found no place for, and
// lists what that table does accept: the usual cause is a typo.
func unknownKeyError(de *toml.DecodeError) *Error {
	line, _ := de.Position()
	path := []string(de.Key())
	what := "unknown key"
	if strings.Contains(de.Error(), "missing table") {
		what = "unknown table"
	}
	e := &Error{Key: keyString(path), Line: line, path: path, Msg: what}
	if len(path) == 0 {
		return e
	}
	parent := path[:len(path)-1]
	if keys := knownKeys(parent); len(keys) > 0 {
		where := "the top level"
		if len(parent) > 0 {
			where = "[" + keyString(parent) + "]"
		}
		e.Msg += fmt.Sprintf("; %s accepts: %s", where, strings.Join(keys, ", "))
	}
	return e
}

// checkTextKinds reports values of the wrong TOML type for fields decoded
// from text (durations). The decoder passes an integer's digits to
// UnmarshalText and returns that error without key or line.
func checkTextKinds(idx index) Errors {
	var errs Errors
	for _, ent := range idx.sorted() {
		if t, ok := fieldType(ent.path); ok && t == durationType && ent.kind != "string" {
			e := newError(ent.path, clip(ent.raw), "wrong type: got a TOML %s, want %s", ent.kind, describeType(t, true))
			e.Line = ent.line
			errs = append(errs, e)
		}
	}
	return errs
}

var (
	configType   = reflect.TypeFor[Config]()
	durationType = reflect.TypeFor[Duration]()
	secretType   = reflect.TypeFor[Secret]()
)

// underSecret reports whether path, or a key above it, decodes into a
// Secret.
func underSecret(path []string) bool {
	for i := 1; i <= len(path); i++ {
		if t, ok := fieldType(path[:i]); ok && t == secretType {
			return true
		}
	}
	return false
}

// fieldType finds the Go type a key path decodes into.
func fieldType(path []string) (reflect.Type, bool) {
	t := configType
	for _, p := range path {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		switch t.Kind() {
		case reflect.Struct:
			f, ok := fieldByTag(t, p)
			if !ok {
				return nil, false
			}
			t = f.Type
		case reflect.Map:
			t = t.Elem()
		case reflect.Slice:
			if !strings.HasPrefix(p, indexMark) {
				return nil, false
			}
			t = t.Elem()
		default:
			return nil, false
		}
	}
	return t, true
}

func fieldByTag(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if tomlName(f) == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func tomlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
	return name
}

// knownKeys lists the keys a table accepts, or nil if it is not a struct.
func knownKeys(path []string) []string {
	t, ok := fieldType(path)
	if !ok {
		return nil
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t == durationType {
		return nil
	}
	var keys []string
	for i := range t.NumField() {
		if n := tomlName(t.Field(i)); n != "" && n != "-" {
			keys = append(keys, n)
		}
	}
	return keys
}

// describeType says in TOML terms what a field takes.
func describeType(t reflect.Type, known bool) string {
	if !known {
		return "another type"
	}
	switch {
	case t == durationType:
		return `a duration string like "5m"`
	case t.Kind() == reflect.String:
		return "a string"
	case t.Kind() == reflect.Bool:
		return "true or false"
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
		return "an array of strings"
	case t.Kind() == reflect.Map && t.Elem().Kind() == reflect.String:
		return "a table of strings"
	case t.Kind() == reflect.Struct, t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Struct:
		return "a table"
	}
	return t.String()
}
