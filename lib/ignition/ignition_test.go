package ignition

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
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
	b, err := decodeDataURL(r.Source)
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

// TestCheckCatches proves Check can fail, one broken config at a time.
func TestCheckCatches(t *testing.T) {
	okHash := sha256.Sum256([]byte("x"))
	good := `{"ignition":{"version":"3.3.0"}}`
	if err := Check([]byte(good)); err != nil {
		t.Fatalf("minimal config: %v", err)
	}
	withFile := func(file string) string {
		return `{"ignition":{"version":"3.3.0"},"storage":{"files":[` + file + `]}}`
	}
	if err := Check([]byte(withFile(`{"path":"/x","mode":420,"contents":{"source":"data:,x","verification":{"hash":"sha256-` + hex.EncodeToString(okHash[:]) + `"}}}`))); err != nil {
		t.Fatalf("percent-encoded inline file with its hash: %v", err)
	}
	cases := map[string]string{
		"not JSON":           `{"ignition":`,
		"two values":         good + good,
		"no ignition":        `{"storage":{}}`,
		"no version":         `{"ignition":{}}`,
		"other version":      `{"ignition":{"version":"3.4.0"}}`,
		"unknown key":        `{"ignition":{"version":"3.3.0"},"storage":{"filez":[]}}`,
		"unknown file key":   withFile(`{"path":"/x","owner":"root"}`),
		"mode as string":     withFile(`{"path":"/x","mode":"0644"}`),
		"mode as float":      withFile(`{"path":"/x","mode":420.5}`),
		"setuid mode":        withFile(`{"path":"/x","mode":2541}`),
		"relative path":      withFile(`{"path":"x"}`),
		"missing path":       withFile(`{"mode":420}`),
		"duplicate path":     withFile(`{"path":"/x"},{"path":"/x"}`),
		"file under file":    withFile(`{"path":"/x"},{"path":"/x/y"}`),
		"bad hash":           withFile(`{"path":"/x","contents":{"source":"https://h/x","verification":{"hash":"sha256-xyz"}}}`),
		"md5 hash":           withFile(`{"path":"/x","contents":{"source":"https://h/x","verification":{"hash":"md5-0123456789abcdef0123456789abcdef"}}}`),
		"inline hash":        withFile(`{"path":"/x","contents":{"source":"data:,y","verification":{"hash":"sha256-` + hex.EncodeToString(okHash[:]) + `"}}}`),
		"xz":                 withFile(`{"path":"/x","contents":{"source":"data:,x","compression":"xz"}}`),
		"not gzip":           withFile(`{"path":"/x","contents":{"source":"data:,x","compression":"gzip"}}`),
		"bad base64":         withFile(`{"path":"/x","contents":{"source":"data:;base64,!!"}}`),
		"ftp":                withFile(`{"path":"/x","contents":{"source":"ftp://h/x"}}`),
		"overwrite, no data": withFile(`{"path":"/x","overwrite":true}`),
		"link no target":     `{"ignition":{"version":"3.3.0"},"storage":{"links":[{"path":"/l"}]}}`,
		"through a link":     `{"ignition":{"version":"3.3.0"},"storage":{"links":[{"path":"/l","target":"/t"}],"directories":[{"path":"/l/d"}]}}`,
		"unit name":          `{"ignition":{"version":"3.3.0"},"systemd":{"units":[{"name":"kubeslot","contents":"x"}]}}`,
		"unit twice":         `{"ignition":{"version":"3.3.0"},"systemd":{"units":[{"name":"a.service"},{"name":"a.service"}]}}`,
		"enabled as string":  `{"ignition":{"version":"3.3.0"},"systemd":{"units":[{"name":"a.service","enabled":"yes"}]}}`,
		"dropin name":        `{"ignition":{"version":"3.3.0"},"systemd":{"units":[{"name":"a.service","dropins":[{"name":"x.ini"}]}]}}`,
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			if err := Check([]byte(c)); err == nil {
				t.Errorf("accepted %s", c)
			} else {
				t.Log(err)
			}
		})
	}
}
