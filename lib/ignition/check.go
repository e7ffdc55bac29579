package ignition

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"path"
	"regexp"
	"sort"
	"strings"
)

// The shape of the spec 3.3.0 subset Check accepts, written from the spec's
// field list (docs/configuration-v3_3.md in coreos/ignition); the published
// JSON schema of 3.4.0 has the same fields and types for these objects.
// Unknown keys are errors here, which the spec's schema does not make them:
// Ignition only warns about them, and a key it ignores is a setting lost.

type kind string

const (
	kString kind = "string"
	kInt    kind = "integer"
	kBool   kind = "boolean"
	kObject kind = "object"
	kArray  kind = "array"
)

type shape struct {
	kind     kind
	fields   map[string]*shape // kObject
	required []string          // kObject
	items    *shape            // kArray
}

func obj(fields map[string]*shape, required ...string) *shape {
	return &shape{kind: kObject, fields: fields, required: required}
}
func arr(items *shape) *shape { return &shape{kind: kArray, items: items} }

var (
	str   = &shape{kind: kString}
	num   = &shape{kind: kInt}
	flag  = &shape{kind: kBool}
	owner = obj(map[string]*shape{"id": num, "name": str})

	resourceShape = obj(map[string]*shape{
		"source":       str,
		"compression":  str,
		"httpHeaders":  arr(obj(map[string]*shape{"name": str, "value": str}, "name")),
		"verification": obj(map[string]*shape{"hash": str}),
	})
	nodeFields = func(extra map[string]*shape) map[string]*shape {
		m := map[string]*shape{"path": str, "overwrite": flag, "user": owner, "group": owner}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	configShape = obj(map[string]*shape{
		"ignition": obj(map[string]*shape{"version": str}, "version"),
		"storage": obj(map[string]*shape{
			"directories": arr(obj(nodeFields(map[string]*shape{"mode": num}), "path")),
			"files":       arr(obj(nodeFields(map[string]*shape{"mode": num, "contents": resourceShape, "append": arr(resourceShape)}), "path")),
			"links":       arr(obj(nodeFields(map[string]*shape{"target": str, "hard": flag}), "path", "target")),
		}),
		"systemd": obj(map[string]*shape{
			"units": arr(obj(map[string]*shape{
				"name": str, "enabled": flag, "mask": flag, "contents": str,
				"dropins": arr(obj(map[string]*shape{"name": str, "contents": str}, "name")),
			}, "name")),
		}),
	}, "ignition")
)

// walk checks v (decoded with UseNumber) against s; problems name the JSON
// path of the offending value.
func walk(at string, v any, s *shape, problems *[]string) {
	bad := func(format string, args ...any) { *problems = append(*problems, at+": "+fmt.Sprintf(format, args...)) }
	if v == nil {
		return // the schema allows null for every optional value
	}
	switch s.kind {
	case kString:
		if _, ok := v.(string); !ok {
			bad("want a string, have %s", jsonType(v))
		}
	case kBool:
		if _, ok := v.(bool); !ok {
			bad("want a boolean, have %s", jsonType(v))
		}
	case kInt:
		n, ok := v.(json.Number)
		if _, err := n.Int64(); !ok || err != nil {
			bad("want an integer, have %s %v", jsonType(v), v)
		}
	case kArray:
		a, ok := v.([]any)
		if !ok {
			bad("want an array, have %s", jsonType(v))
			return
		}
		for i, e := range a {
			walk(fmt.Sprintf("%s[%d]", at, i), e, s.items, problems)
		}
	case kObject:
		m, ok := v.(map[string]any)
		if !ok {
			bad("want an object, have %s", jsonType(v))
			return
		}
		for _, r := range s.required {
			if m[r] == nil {
				bad("required key %q is missing", r)
			}
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			field, ok := s.fields[k]
			if !ok {
				bad("unknown key %q", k)
				continue
			}
			walk(at+"."+k, m[k], field, problems)
		}
	}
}

func jsonType(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

var hashRE = regexp.MustCompile(`^(sha256-[0-9a-f]{64}|sha512-[0-9a-f]{128})$`)

// Check reports what is wrong with an Ignition config for spec 3.3.0, within
// the subset this package writes: the shape (keys, types, required keys),
// then the rules Ignition applies when it runs: absolute unique paths, no
// path through a link or a file of the config, permission-only modes,
// decodable data: URLs and known compressions, well-formed hashes (and
// matching ones for inline contents), unit names with a unit type.
func Check(data []byte) error {
	v, err := decodeOne(data)
	if err != nil {
		return err
	}
	var problems []string
	walk("$", v, configShape, &problems)
	if len(problems) > 0 {
		return fmt.Errorf("ignition config: %s", strings.Join(problems, "; "))
	}
	var cfg checkedConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("ignition config: %w", err)
	}
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if cfg.Ignition.Version != SpecVersion {
		bad("$.ignition.version %q: want %q", cfg.Ignition.Version, SpecVersion)
	}
	nodes := checkStorage(cfg, bad)
	checkPaths(nodes, bad)
	checkUnits(cfg.Systemd.Units, bad)
	if len(problems) > 0 {
		return fmt.Errorf("ignition config: %s", strings.Join(problems, "; "))
	}
	return nil
}

// decodeOne parses data as exactly one JSON value, numbers kept as written,
// for the shape walk.
func decodeOne(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("ignition config: not JSON: %w", err)
	}
	if dec.More() {
		return nil, errors.New("ignition config: more than one JSON value")
	}
	return v, nil
}

// checkedConfig is what Check reads of a config once its shape is right.
type checkedConfig struct {
	Ignition Ignition
	Storage  struct {
		Directories []struct {
			Path string
			Mode *int
		}
		Files []struct {
			Path      string
			Mode      *int
			Overwrite *bool
			Contents  *Resource
			Append    []Resource
		}
		Links []Link
	}
	Systemd struct {
		Units []checkedUnit
	}
}

// checkedUnit is what Check reads of a systemd unit.
type checkedUnit struct {
	Name    string
	Dropins []struct{ Name string }
}

// pathNode is one directory, file or link of the config, where it is
// written (at) for the messages.
type pathNode struct{ at, path, kind string }

// checkStorage checks each directory, file and link on its own (modes,
// contents, link targets) and returns them all for the path rules.
func checkStorage(cfg checkedConfig, bad func(string, ...any)) []pathNode {
	var nodes []pathNode
	mode := func(at string, m *int) {
		if m != nil && (*m < 0 || *m > 0o777) {
			bad("%s.mode %d (%#o): only permission bits 0-0777 are supported", at, *m, *m)
		}
	}
	for i, d := range cfg.Storage.Directories {
		at := fmt.Sprintf("$.storage.directories[%d]", i)
		nodes = append(nodes, pathNode{at, d.Path, "directory"})
		mode(at, d.Mode)
	}
	for i, f := range cfg.Storage.Files {
		at := fmt.Sprintf("$.storage.files[%d]", i)
		nodes = append(nodes, pathNode{at, f.Path, "file"})
		mode(at, f.Mode)
		if f.Contents != nil {
			checkResource(at+".contents", *f.Contents, bad)
		}
		if f.Overwrite != nil && *f.Overwrite && (f.Contents == nil || f.Contents.Source == "") {
			bad("%s: overwrite needs contents.source", at)
		}
		for j, a := range f.Append {
			checkResource(fmt.Sprintf("%s.append[%d]", at, j), a, bad)
		}
	}
	for i, l := range cfg.Storage.Links {
		at := fmt.Sprintf("$.storage.links[%d]", i)
		nodes = append(nodes, pathNode{at, l.Path, "link"})
		if l.Target == "" {
			bad("%s: empty target", at)
		}
	}
	return nodes
}

// checkPaths applies Ignition's path rules across the config: clean absolute
// paths, each written once, none through a link or file of the config.
func checkPaths(nodes []pathNode, bad func(string, ...any)) {
	seen := map[string]pathNode{}
	for _, n := range nodes {
		if !path.IsAbs(n.path) || path.Clean(n.path) != n.path || n.path == "/" {
			bad("%s.path %q: want a clean absolute path below /", n.at, n.path)
		}
		if o, dup := seen[n.path]; dup {
			bad("%s.path %q: also %s", n.at, n.path, o.at)
		}
		seen[n.path] = n
	}
	for _, n := range nodes {
		for _, o := range nodes {
			if o.kind != "directory" && strings.HasPrefix(n.path, o.path+"/") {
				bad("%s.path %q: goes through %s, a %s of the config", n.at, n.path, o.at, o.kind)
			}
		}
	}
}

// checkUnits checks unit names (a systemd unit type, each listed once) and
// drop-in names.
func checkUnits(units []checkedUnit, bad func(string, ...any)) {
	seen := map[string]bool{}
	for i, u := range units {
		at := fmt.Sprintf("$.systemd.units[%d]", i)
		if !validUnitName(u.Name) {
			bad("%s.name %q: want NAME.TYPE with a systemd unit type", at, u.Name)
		}
		if seen[u.Name] {
			bad("%s.name %q: listed twice", at, u.Name)
		}
		seen[u.Name] = true
		for j, d := range u.Dropins {
			if !strings.HasSuffix(d.Name, ".conf") || strings.Contains(d.Name, "/") {
				bad("%s.dropins[%d].name %q: want NAME.conf", at, j, d.Name)
			}
		}
	}
}

// checkResource checks a contents source: scheme, compression, hash, and
// for inline (data:) contents that they decode and match the hash.
func checkResource(at string, r Resource, bad func(string, ...any)) {
	if r.Compression != "" && r.Compression != "gzip" {
		bad("%s.compression %q: want gzip or nothing", at, r.Compression)
	}
	h := r.Verification.Hash
	if h != "" && !hashRE.MatchString(h) {
		bad("%s.verification.hash %q: want sha256-<64 hex> or sha512-<128 hex>", at, h)
		h = ""
	}
	if r.Source == "" {
		return
	}
	u, err := url.Parse(r.Source)
	if err != nil {
		bad("%s.source: %v", at, err)
		return
	}
	switch u.Scheme {
	case "http", "https", "tftp", "s3", "gs":
		if u.Host == "" {
			bad("%s.source %q: no host", at, r.Source)
		}
		return
	case "data":
	default:
		bad("%s.source: scheme %q: want http, https, tftp, s3, gs or data", at, u.Scheme)
		return
	}
	content, err := decodeDataURL(r.Source)
	if err != nil {
		bad("%s.source: %v", at, err)
		return
	}
	if r.Compression == "gzip" {
		zr, err := gzip.NewReader(bytes.NewReader(content))
		if err == nil {
			content, err = io.ReadAll(zr)
		}
		if err != nil {
			bad("%s: compression gzip, but the contents do not decompress: %v", at, err)
			return
		}
	}
	if h != "" {
		var sum []byte
		if strings.HasPrefix(h, "sha256-") {
			s := sha256.Sum256(content)
			sum = s[:]
		} else {
			s := sha512.Sum512(content)
			sum = s[:]
		}
		if got := h[:7] + hex.EncodeToString(sum); got != h {
			bad("%s.verification.hash %s: the inline contents have %s", at, h, got)
		}
	}
}

// decodeDataURL decodes an RFC 2397 data: URL (base64 or percent-encoded).
func decodeDataURL(s string) ([]byte, error) {
	rest := strings.TrimPrefix(s, "data:")
	meta, payload, ok := strings.Cut(rest, ",")
	if !ok {
		return nil, errors.New("data URL without ','")
	}
	if strings.HasSuffix(meta, ";base64") {
		b, err := base64.StdEncoding.DecodeString(payload)
		if err != nil {
			return nil, fmt.Errorf("data URL: bad base64: %v", err)
		}
		return b, nil
	}
	b, err := url.PathUnescape(payload)
	if err != nil {
		return nil, fmt.Errorf("data URL: bad percent-encoding: %v", err)
	}
	return []byte(b), nil
}
