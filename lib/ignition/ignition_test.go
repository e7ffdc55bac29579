package ignition

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
)

func mustRemote(t *testing.T, rawURL, sha256hex string) Source {
	t.Helper()
	s, err := Remote(rawURL, sha256hex)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// contents decodes a file's inline contents the way Ignition does.
func contents(t *testing.T, r Resource) []byte {
	t.Helper()
	b64, ok := strings.CutPrefix(r.Source, "data:;base64,")
	if !ok {
		t.Fatalf("source %.40q is not inline base64", r.Source)
	}
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatal(err)
	}
	if r.Compression == "gzip" {
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		if b, err = io.ReadAll(zr); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

func TestBuild(t *testing.T) {
	b := NewBuilder()
	text := []byte("[machine]\nname = \"w-1\" # <&> and 100% \"quotes\"\n")
	// Incompressible bytes stay plain even when large; compressible ones
	// are gzipped.
	noise := make([]byte, 200<<10)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range noise {
		noise[i] = byte(rng.Uint32())
	}
	big := bytes.Repeat([]byte("kubeslot binary "), 20<<10)
	sum := sha256.Sum256(big)
	steps := []error{
		b.Directory("/opt/kubeslot", 0o755),
		b.Directory("/opt/kubeslot/releases/blue", 0o755),
		b.File("/etc/kubeslot/config.toml", 0o600, Inline(text)),
		b.File("/opt/kubeslot/releases/blue/noise", 0o644, Inline(noise)),
		b.File("/opt/kubeslot/releases/blue/big", 0o755, Inline(big)),
		b.File("/opt/kubeslot/releases/blue/remote", 0o755, mustRemote(t, "https://mirror.example/r/kubeslot-x?sig=a%2Fb", strings.ToUpper(hex.EncodeToString(sum[:])))),
		b.Link("/opt/kubeslot/current", "releases/blue"),
		b.Unit("kubeslot-x.service", []byte("[Service]\nExecStart=/opt/kubeslot/current/kubeslot-x\n[Install]\nWantedBy=multi-user.target\n"), true),
	}
	for i, err := range steps {
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	out, err := b.JSON()
	if err != nil {
		t.Fatal(err)
	}
	if err := Check(out); err != nil {
		t.Fatal(err)
	}
	// Modes are decimal in the JSON, as the spec requires.
	for _, want := range []string{`"version": "3.3.0"`, `"mode": 384`, `"mode": 493`, `"target": "releases/blue"`, `"enabled": true`} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("output lacks %s", want)
		}
	}
	var got Config
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	files := map[string]Resource{}
	for _, f := range got.Storage.Files {
		files[f.Path] = f.Contents
	}
	if c := files["/etc/kubeslot/config.toml"]; c.Compression != "" || !bytes.Equal(contents(t, c), text) {
		t.Errorf("small text: compression %q, contents %q", c.Compression, contents(t, c))
	}
	if c := files["/opt/kubeslot/releases/blue/noise"]; c.Compression != "" || !bytes.Equal(contents(t, c), noise) {
		t.Errorf("incompressible data: compression %q, round trip ok %v", c.Compression, bytes.Equal(contents(t, c), noise))
	}
	c := files["/opt/kubeslot/releases/blue/big"]
	if c.Compression != "gzip" || !bytes.Equal(contents(t, c), big) {
		t.Errorf("compressible data: compression %q, round trip ok %v", c.Compression, bytes.Equal(contents(t, c), big))
	}
	t.Logf("inline sizes: %d bytes of text as %d, %d compressible bytes as %d", len(text), len(files["/etc/kubeslot/config.toml"].Source), len(big), len(c.Source))
	r := files["/opt/kubeslot/releases/blue/remote"]
	if r.Source != "https://mirror.example/r/kubeslot-x?sig=a%2Fb" || r.Verification.Hash != "sha256-"+hex.EncodeToString(sum[:]) {
		t.Errorf("remote: %+v", r)
	}
	if len(got.Systemd.Units) != 1 || got.Systemd.Units[0].Enabled == nil || !*got.Systemd.Units[0].Enabled ||
		!strings.Contains(got.Systemd.Units[0].Contents, "WantedBy=multi-user.target\n") {
		t.Errorf("units: %+v", got.Systemd.Units)
	}
	// An empty builder is a valid config too.
	if out, err := NewBuilder().JSON(); err != nil || !bytes.Contains(out, []byte(`"version": "3.3.0"`)) || bytes.Contains(out, []byte("storage")) {
		t.Errorf("empty config: %s (%v)", out, err)
	}
}

func TestBuilderRefuses(t *testing.T) {
	text := Inline([]byte("x"))
	hex64 := strings.Repeat("ab", 32)
	cases := map[string]func(b *Builder) error{
		"relative path":     func(b *Builder) error { return b.File("etc/x", 0o644, text) },
		"unclean path":      func(b *Builder) error { return b.File("/etc/../x", 0o644, text) },
		"root":              func(b *Builder) error { return b.Directory("/", 0o755) },
		"trailing slash":    func(b *Builder) error { return b.Directory("/etc/", 0o755) },
		"setuid":            func(b *Builder) error { return b.File("/x", 0o4755, text) },
		"no source":         func(b *Builder) error { return b.File("/x", 0o644, Source{}) },
		"empty link target": func(b *Builder) error { return b.Link("/x", "") },
		"unit without type": func(b *Builder) error { return b.Unit("kubeslot", []byte("[Service]\n"), true) },
		"unit unknown type": func(b *Builder) error { return b.Unit("kubeslot.serv", []byte("[Service]\n"), true) },
		"unit bare type":    func(b *Builder) error { return b.Unit(".service", []byte("[Service]\n"), true) },
		"unit with slash":   func(b *Builder) error { return b.Unit("a/b.service", []byte("[Service]\n"), true) },
		"unit empty":        func(b *Builder) error { return b.Unit("a.service", []byte(" \n"), true) },
		"duplicate path":    func(b *Builder) error { _ = b.Directory("/x", 0o755); return b.File("/x", 0o644, text) },
		"duplicate unit": func(b *Builder) error {
			_ = b.Unit("a.service", []byte("[Service]\n"), true)
			return b.Unit("a.service", []byte("[Service]\n"), false)
		},
		"file under file": func(b *Builder) error { _ = b.File("/x", 0o644, text); return b.File("/x/y", 0o644, text) },
		"file under link": func(b *Builder) error {
			_ = b.Link("/opt/current", "blue")
			return b.File("/opt/current/bin", 0o755, text)
		},
		"link over a parent": func(b *Builder) error {
			_ = b.File("/opt/current/bin", 0o755, text)
			return b.Link("/opt/current", "blue")
		},
		"remote ftp": func(b *Builder) error {
			_, err := Remote("ftp://h/x", hex64)
			return err
		},
		"remote no host": func(b *Builder) error {
			_, err := Remote("https:///x", hex64)
			return err
		},
		"remote short digest": func(b *Builder) error {
			_, err := Remote("https://h/x", hex64[:62])
			return err
		},
		"remote bad digest": func(b *Builder) error {
			_, err := Remote("https://h/x", "zz"+hex64[2:])
			return err
		},
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			if err := f(NewBuilder()); err == nil {
				t.Error("accepted")
			} else {
				t.Log(err)
			}
		})
	}
	// A directory may hold other nodes.
	b := NewBuilder()
	if err := b.Directory("/opt/kubeslot", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := b.File("/opt/kubeslot/x", 0o600, text); err != nil {
		t.Errorf("file under a directory: %v", err)
	}
}

// TestCheckCatches proves Check can fail, one broken config at a time, and
// that each refusal names where in the config the problem is. Ignition's own
// validation catches these; warnings (a key Ignition would ignore, setuid
// bits it would drop, an enabled unit it could not enable) fail as errors.
func TestCheckCatches(t *testing.T) {
	okHash := sha256.Sum256([]byte("x"))
	hex64 := hex.EncodeToString(okHash[:])
	good := `{"ignition":{"version":"3.3.0"}}`
	if err := Check([]byte(good)); err != nil {
		t.Fatalf("minimal config: %v", err)
	}
	config := func(storage, systemd string) string {
		return `{"ignition":{"version":"3.3.0"},"storage":{` + storage + `},"systemd":{` + systemd + `}}`
	}
	withFile := func(file string) string { return config(`"files":[`+file+`]`, "") }
	withUnit := func(unit string) string { return config("", `"units":[`+unit+`]`) }
	ok := map[string]string{
		"percent-encoded inline file with its hash": withFile(`{"path":"/x","mode":420,"contents":{"source":"data:,x","verification":{"hash":"sha256-` + hex64 + `"}}}`),
		"remote file, sha512":                       withFile(`{"path":"/x","contents":{"source":"https://h/x","verification":{"hash":"sha512-` + hex64 + hex64 + `"}}}`),
		"enabled unit with [Install]":               withUnit(`{"name":"a.service","enabled":true,"contents":"[Service]\nExecStart=/x\n[Install]\nWantedBy=multi-user.target\n"}`),
	}
	for name, c := range ok {
		if err := Check([]byte(c)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	cases := []struct{ name, config, want string }{
		{"not JSON", `{"ignition":`, "unexpected end of JSON input"},
		{"two values", good + good, "after top-level value"},
		{"empty", ``, "empty"},
		{"no ignition", `{"storage":{}}`, "unsupported config version"},
		{"no version", `{"ignition":{}}`, "unsupported config version"},
		{"other version", `{"ignition":{"version":"3.4.0"}}`, "unsupported config version"},
		{"unknown key", config(`"filez":[]`, ""), "$.storage.filez"},
		{"unknown file key", withFile(`{"path":"/x","owner":"root"}`), "$.storage.files.0.owner"},
		{"unknown top key", `{"ignition":{"version":"3.3.0"},"passwords":{}}`, "unused key passwords"},
		{"mode as string", withFile(`{"path":"/x","mode":"0644"}`), "mode of type int"},
		{"mode as float", withFile(`{"path":"/x","mode":420.5}`), "mode of type int"},
		{"mode too large", withFile(`{"path":"/x","mode":8192}`), "$.storage.files.0.mode"},
		{"negative mode", config(`"directories":[{"path":"/d","mode":-1}]`, ""), "$.storage.directories.0.mode"},
		{"setuid mode", withFile(`{"path":"/x","mode":2541}`), "setuid"},
		{"relative path", withFile(`{"path":"x"}`), "path not absolute"},
		{"unclean path", withFile(`{"path":"/etc/../x"}`), "$.storage.files.0.path"},
		{"missing path", withFile(`{"mode":420}`), "path not specified"},
		{"duplicate file", withFile(`{"path":"/x"},{"path":"/x"}`), "$.storage.files.1"},
		{"duplicate path, file and directory", config(`"directories":[{"path":"/x"}],"files":[{"path":"/x"}]`, ""), "duplicate entry"},
		{"duplicate path, link and file", config(`"files":[{"path":"/x"}],"links":[{"path":"/x","target":"/t"}]`, ""), "duplicate entry"},
		{"hash too short", withFile(`{"path":"/x","contents":{"source":"https://h/x","verification":{"hash":"sha256-xyz"}}}`), "incorrect size for hash sum"},
		{"md5 hash", withFile(`{"path":"/x","contents":{"source":"https://h/x","verification":{"hash":"md5-0123456789abcdef0123456789abcdef"}}}`), "unrecognized hash function"},
		{"hash without function", withFile(`{"path":"/x","contents":{"source":"https://h/x","verification":{"hash":"` + hex64 + `"}}}`), "malformed hash"},
		{"sha512 of a sha256 size", withFile(`{"path":"/x","contents":{"source":"https://h/x","verification":{"hash":"sha512-` + hex64 + `"}}}`), "incorrect size"},
		{"xz", withFile(`{"path":"/x","contents":{"source":"data:,x","compression":"xz"}}`), "invalid compression"},
		{"bad base64", withFile(`{"path":"/x","contents":{"source":"data:;base64,!!"}}`), "$.storage.files.0.contents.source"},
		{"data URL without comma", withFile(`{"path":"/x","contents":{"source":"data:x"}}`), "$.storage.files.0.contents.source"},
		{"ftp source", withFile(`{"path":"/x","contents":{"source":"ftp://h/x"}}`), "invalid url scheme"},
		{"source without scheme", withFile(`{"path":"/x","contents":{"source":"mirror.example/x"}}`), "invalid url scheme"},
		{"source not a URL", withFile(`{"path":"/x","contents":{"source":"https://h/%zz"}}`), "$.storage.files.0.contents.source"},
		{"headers on a data URL", withFile(`{"path":"/x","contents":{"source":"data:,x","httpHeaders":[{"name":"A","value":"b"}]}}`), "$.storage.files.0.contents"},
		{"overwrite, no data", withFile(`{"path":"/x","overwrite":true}`), "overwrite"},
		{"link no target", config(`"links":[{"path":"/l"}]`, ""), "link target is required"},
		{"through a link", config(`"links":[{"path":"/l","target":"/t"}],"directories":[{"path":"/l/d"}]`, ""), "includes link"},
		{"unit name", withUnit(`{"name":"kubeslot","contents":"x"}`), "invalid systemd unit extension"},
		{"unit twice", withUnit(`{"name":"a.service"},{"name":"a.service"}`), "$.systemd.units.1"},
		{"unit not parsable", withUnit(`{"name":"a.service","contents":"[Service\nExecStart=/x\n"}`), "$.systemd.units.0.contents"},
		{"enabled unit without [Install]", withUnit(`{"name":"a.service","enabled":true,"contents":"[Service]\nExecStart=/x\n"}`), "$.systemd.units.0.contents"},
		{"enabled as string", withUnit(`{"name":"a.service","enabled":"yes"}`), "of type bool"},
		{"dropin name", withUnit(`{"name":"a.service","dropins":[{"name":"x.ini"}]}`), "drop-in extension"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := Check([]byte(c.config))
			switch {
			case err == nil:
				t.Errorf("accepted %s", c.config)
			case !strings.Contains(err.Error(), c.want):
				t.Errorf("error does not name %q: %v", c.want, err)
			default:
				t.Log(err)
			}
		})
	}
}

// TestBuilderRulesBeyondCheck pins why the Builder keeps rules of its own:
// each config below passes Ignition's validation (Check) but fails at boot,
// and the Builder refuses the same thing. If upstream starts catching one,
// this test says so and the Builder's copy of the rule can go.
func TestBuilderRulesBeyondCheck(t *testing.T) {
	text := Inline([]byte("x"))
	hexZ := strings.Repeat("z", 64)
	cases := []struct {
		name   string
		config string
		build  func(b *Builder) error
	}{
		{"file under a file",
			`{"ignition":{"version":"3.3.0"},"storage":{"files":[{"path":"/x"},{"path":"/x/y"}]}}`,
			func(b *Builder) error { _ = b.File("/x", 0o644, text); return b.File("/x/y", 0o644, text) }},
		{"unit name with a slash",
			`{"ignition":{"version":"3.3.0"},"systemd":{"units":[{"name":"a/b.service","contents":"[Service]\nExecStart=/x\n"}]}}`,
			func(b *Builder) error { return b.Unit("a/b.service", []byte("[Service]\nExecStart=/x\n"), false) }},
		{"https source without a host",
			`{"ignition":{"version":"3.3.0"},"storage":{"files":[{"path":"/x","contents":{"source":"https:///x"}}]}}`,
			func(b *Builder) error { _, err := Remote("https:///x", strings.Repeat("ab", 32)); return err }},
		{"digest that is not hex",
			`{"ignition":{"version":"3.3.0"},"storage":{"files":[{"path":"/x","contents":{"source":"https://h/x","verification":{"hash":"sha256-` + hexZ + `"}}}]}}`,
			func(b *Builder) error { _, err := Remote("https://h/x", hexZ); return err }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := Check([]byte(c.config)); err != nil {
				t.Errorf("Ignition's validation now refuses it (the Builder's rule may go): %v", err)
			}
			if err := c.build(NewBuilder()); err == nil {
				t.Error("the Builder accepted it")
			}
		})
	}
}

// The operator's own config is merged by Ignition itself: it goes into
// ignition.config.merge (inline, checked first), and the result passes
// Check; a config that does not is refused. Butane output is the same
// sections under variant and version, for fcos and flatcar only.
func TestMergeAndButane(t *testing.T) {
	b := NewBuilder()
	if err := b.File("/etc/kubeslot/config.toml", 0o600, Inline([]byte("x"))); err != nil {
		t.Fatal(err)
	}
	user := []byte(`{"ignition":{"version":"3.3.0"},"storage":{"files":[{"path":"/etc/motd","contents":{"source":"data:,hello"}}]}}`)
	if err := b.Merge(user); err != nil {
		t.Fatal(err)
	}
	if err := b.Merge([]byte(`{"ignition":{"version":"3.3.0"},"storage":{"nope":1}}`)); err == nil {
		t.Error("a config Ignition warns about was merged")
	}
	out, err := b.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Ignition struct {
			Config struct {
				Merge []struct{ Source string } `json:"merge"`
			} `json:"config"`
		} `json:"ignition"`
	}
	if err := json.Unmarshal(out, &doc); err != nil || len(doc.Ignition.Config.Merge) != 1 || !strings.HasPrefix(doc.Ignition.Config.Merge[0].Source, "data:") {
		t.Fatalf("merge: %+v, %v\n%s", doc, err, out)
	}
	y, err := b.Butane("flatcar")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"variant: flatcar", "version: 1.0.0", "path: /etc/kubeslot/config.toml", "merge:"} {
		if !strings.Contains(string(y), want) {
			t.Errorf("butane lacks %q:\n%s", want, y)
		}
	}
	if strings.Contains(string(y), "3.3.0") {
		t.Errorf("butane keeps the Ignition spec version:\n%s", y)
	}
	if _, err := b.Butane("rhcos"); err == nil {
		t.Error("an unknown variant was written")
	}
}
