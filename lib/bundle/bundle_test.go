package bundle

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

var created = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func TestMain(m *testing.M) {
	now = func() time.Time { return created.Add(123 * time.Millisecond) }
	os.Exit(m.Run())
}

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func write(t *testing.T, p, body string, mode fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

var unitBodies = map[string]string{
	"kubeslot-watcher.service":  "[Service]\nExecStart=@BASE@/current/kubeslot-watcher\n",
	"kubeslot-repave.path":      "[Path]\nPathExists=@BASE@/requests/repave.json\n",
	"kubeslot-repave@.service":  "[Service]\nExecStart=@BASE@/current/kubeslot-repaver %i\n",
	"kubeslot-cleanup.timer":    "[Timer]\nOnCalendar=daily\n",
	"kubeslot-something.target": "[Unit]\n",
}

// sources writes a bin directory (fake binaries, deliberately not 0755, and
// a file that is no binary) and a units directory (templates, and files that
// are no units).
func sources(t *testing.T) (binDir, unitsDir string) {
	t.Helper()
	base := t.TempDir()
	binDir, unitsDir = filepath.Join(base, "bin"), filepath.Join(base, "units")
	for _, n := range Binaries {
		write(t, filepath.Join(binDir, n), "#!/bin/sh\necho "+n+"\n"+strings.Repeat("x", 5000), 0o700)
	}
	write(t, filepath.Join(binDir, "kubeslot-extra.tar.gz"), "not a binary", 0o644)
	for n, b := range unitBodies {
		write(t, filepath.Join(unitsDir, n), b, 0o600)
	}
	write(t, filepath.Join(unitsDir, "units.go"), "package units\n", 0o644)
	write(t, filepath.Join(unitsDir, "units_test.go"), "package units\n", 0o644)
	write(t, filepath.Join(unitsDir, "x.service.d", "a.conf"), "[Service]\n", 0o644)
	return binDir, unitsDir
}

// create writes a bundle from fresh sources and returns its path and sha256.
func create(t *testing.T) (string, string, *Manifest) {
	t.Helper()
	binDir, unitsDir := sources(t)
	var buf bytes.Buffer
	m, err := Create(&buf, binDir, unitsDir, "v1.2.3-4-gabcdef", "amd64", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "kubeslot.tar.gz")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p, sum(buf.Bytes()), m
}

func TestRoundTrip(t *testing.T) {
	binDir, unitsDir := sources(t)
	var buf, again bytes.Buffer
	m, err := Create(&buf, binDir, unitsDir, "v1.2.3", "arm64", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Create(&again, binDir, unitsDir, "v1.2.3", "arm64", time.Time{}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Error("two bundles of the same files at the same time differ")
	}
	if !m.Created.Equal(created) || m.Created.Location() != time.UTC {
		t.Errorf("created %s, want %s (UTC, whole seconds)", m.Created.Format(time.RFC3339Nano), created.Format(time.RFC3339Nano))
	}

	// The archive itself: order, modes, times, owners.
	zr, err := gzip.NewReader(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name)
		want := int64(UnitMode)
		switch {
		case hdr.Typeflag == tar.TypeDir:
			want = dirMode
		case slices.Contains(Binaries, hdr.Name):
			want = BinaryMode
		}
		if hdr.Mode != want || !hdr.ModTime.Equal(created) || hdr.Uid != 0 || hdr.Gid != 0 {
			t.Errorf("%s: mode %#o mtime %s uid %d gid %d; want mode %#o mtime %s, root", hdr.Name, hdr.Mode, hdr.ModTime, hdr.Uid, hdr.Gid, want, created)
		}
	}
	wantNames := append(append([]string{ManifestName}, Binaries...), "units/",
		"units/kubeslot-cleanup.timer", "units/kubeslot-repave.path", "units/kubeslot-repave@.service",
		"units/kubeslot-something.target", "units/kubeslot-watcher.service")
	if !slices.Equal(names, wantNames) {
		t.Errorf("entries:\n %q\nwant\n %q", names, wantNames)
	}

	p := filepath.Join(t.TempDir(), "b.tar.gz")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	dest := filepath.Join(t.TempDir(), "green")
	got, err := Unpack(context.Background(), p, sum(buf.Bytes()), "arm64", dest, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	mj, _ := json.Marshal(m)
	gj, _ := json.Marshal(got)
	if !bytes.Equal(mj, gj) {
		t.Errorf("Unpack's manifest\n %s\ndiffers from Create's\n %s", gj, mj)
	}
	for _, n := range Binaries {
		want, _ := os.ReadFile(filepath.Join(binDir, n))
		have, err := os.ReadFile(filepath.Join(dest, n))
		if err != nil || !bytes.Equal(have, want) {
			t.Errorf("%s: content differs (%v)", n, err)
		}
		if fi, err := os.Stat(filepath.Join(dest, n)); err != nil || fi.Mode() != BinaryMode {
			t.Errorf("%s: mode %v (%v), want %v", n, fi.Mode(), err, fs.FileMode(BinaryMode))
		}
	}
	for n, body := range unitBodies {
		have, err := os.ReadFile(filepath.Join(dest, UnitsDir, n))
		if err != nil || string(have) != body {
			t.Errorf("units/%s: %q (%v), want %q", n, have, err, body)
		}
	}
	if _, err := os.Stat(filepath.Join(dest, UnitsDir, "units.go")); err == nil {
		t.Error("units.go was bundled")
	}
	if _, err := os.Stat(dest + ".partial"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("staging directory left behind: %v", err)
	}
	if _, err := VerifyDir(dest, "arm64"); err != nil {
		t.Errorf("VerifyDir after Unpack: %v", err)
	}
	if f, ok := got.File("units/kubeslot-watcher.service"); !ok || f.Mode != UnitMode || f.SHA256 != sum([]byte(unitBodies["kubeslot-watcher.service"])) {
		t.Errorf("File(units/kubeslot-watcher.service) = %+v, %v", f, ok)
	}
	if _, ok := got.File("units.go"); ok {
		t.Error("File(units.go) found")
	}
}

func TestCreateRefuses(t *testing.T) {
	binDir, unitsDir := sources(t)
	for name, c := range map[string]struct {
		prep           func()
		version, arch  string
		want           string
		wantErrInvalid bool
	}{
		"bad version":    {version: "1.0 beta", arch: "amd64", want: `version "1.0 beta"`, wantErrInvalid: true},
		"empty version":  {version: "", arch: "amd64", want: `version ""`, wantErrInvalid: true},
		"unknown arch":   {version: "v1", arch: "x86_64", want: `architecture "x86_64"`, wantErrInvalid: true},
		"missing binary": {prep: func() { os.Remove(filepath.Join(binDir, "kubeslot-watcher")) }, want: "kubeslot-watcher"},
		"binary is a dir": {prep: func() {
			os.Remove(filepath.Join(binDir, "kubeslot-watcher"))
			os.Mkdir(filepath.Join(binDir, "kubeslot-watcher"), 0o755)
		},
			want: "kubeslot-watcher: not a regular file"},
		"unit symlink": {prep: func() { os.Symlink("/etc/passwd", filepath.Join(unitsDir, "evil.service")) },
			want: "evil.service: not a regular file"},
		"no units": {prep: func() {
			for n := range unitBodies {
				os.Remove(filepath.Join(unitsDir, n))
			}
		}, want: "no .service"},
	} {
		t.Run(name, func(t *testing.T) {
			binDir, unitsDir = sources(t)
			if c.prep != nil {
				c.prep()
			}
			if c.version == "" && c.arch == "" {
				c.version, c.arch = "v1", "amd64"
			}
			var buf bytes.Buffer
			_, err := Create(&buf, binDir, unitsDir, c.version, c.arch, time.Time{})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one naming %q", err, c.want)
			}
			if errors.Is(err, ErrInvalid) != c.wantErrInvalid {
				t.Errorf("errors.Is(err, ErrInvalid) = %v, want %v", !c.wantErrInvalid, c.wantErrInvalid)
			}
			if buf.Len() != 0 {
				t.Errorf("%d bytes written before the error", buf.Len())
			}
		})
	}
}

func TestWriteManifest(t *testing.T) {
	binDir, _ := sources(t)
	dir := filepath.Join(t.TempDir(), "blue")
	for _, n := range Binaries {
		data, _ := os.ReadFile(filepath.Join(binDir, n))
		write(t, filepath.Join(dir, n), string(data), 0o755)
	}
	body := unitBodies["kubeslot-watcher.service"]
	write(t, filepath.Join(dir, UnitsDir, "kubeslot-watcher.service"), body, 0o644)
	write(t, filepath.Join(dir, ManifestName), "stale", 0o644)
	m, err := WriteManifest(dir, "v2", "amd64")
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Files) != len(Binaries)+1 {
		t.Errorf("manifest lists %d files, want %d: %+v", len(m.Files), len(Binaries)+1, m.Files)
	}
	if _, err := VerifyDir(dir, "amd64"); err != nil {
		t.Errorf("VerifyDir: %v", err)
	}
	if f, ok := m.File("units/kubeslot-watcher.service"); !ok || f.Size != int64(len(body)) || f.Mode != 0o644 {
		t.Errorf("unit entry %+v, %v", f, ok)
	}

	os.Symlink("kubeslot", filepath.Join(dir, "kubeslot-alias"))
	if _, err := WriteManifest(dir, "v2", "amd64"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "kubeslot-alias") {
		t.Errorf("with a symlink: err = %v, want ErrInvalid naming kubeslot-alias", err)
	}
	os.Remove(filepath.Join(dir, "kubeslot-alias"))
	os.Remove(filepath.Join(dir, "kubeslot-upgrader"))
	if _, err := WriteManifest(dir, "v2", "amd64"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "kubeslot-upgrader is missing") {
		t.Errorf("without a binary: err = %v, want ErrInvalid naming kubeslot-upgrader", err)
	}
}

// --- malicious and broken bundles, built by hand ---

// ent is one hand-made archive entry; typ defaults to a regular file.
type ent struct {
	name, body, link string
	typ              byte
	mode             int64
	size             int64 // when not 0: the header's size, whatever the body
	unlisted         bool  // left out of the manifest
}

// goodEnts are the entries of a valid bundle.
func goodEnts() []ent {
	var es []ent
	for _, n := range Binaries {
		es = append(es, ent{name: n, body: "#!/bin/sh\necho " + n + "\n", mode: 0o755})
	}
	es = append(es, ent{name: "units/", typ: tar.TypeDir, mode: 0o755})
	es = append(es, ent{name: "units/kubeslot-watcher.service", body: unitBodies["kubeslot-watcher.service"], mode: 0o644})
	return es
}

// manifestOf lists the regular files of es.
func manifestOf(es []ent) *Manifest {
	m := &Manifest{Version: "v1", Arch: "amd64", Created: created}
	for _, e := range es {
		if e.typ == 0 && !e.unlisted {
			m.Files = append(m.Files, File{Path: e.name, SHA256: sum([]byte(e.body)), Size: int64(len(e.body)), Mode: uint32(e.mode)})
		}
	}
	return m
}

// tarOf writes es as a gzip tar (plain when gz is false), manifest first
// unless m is nil.
func tarOf(t *testing.T, m *Manifest, es []ent, gz bool) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	if m != nil {
		data, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		es = append([]ent{{name: ManifestName, body: string(data), mode: 0o644}}, es...)
	}
	for _, e := range es {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		size := int64(len(e.body))
		if typ != tar.TypeReg {
			size = 0
		}
		if e.size != 0 {
			size = e.size
		}
		hdr := &tar.Header{Name: e.name, Typeflag: typ, Mode: e.mode, Size: size, Linkname: e.link, ModTime: created, Format: tar.FormatPAX}
		if typ == tar.TypeXGlobalHeader {
			hdr = &tar.Header{Typeflag: typ, PAXRecords: map[string]string{"comment": e.name}}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if typ == tar.TypeReg {
			body := e.body
			if e.size > int64(len(body)) {
				body += strings.Repeat("\x00", int(e.size)-len(body))
			}
			if _, err := tw.Write([]byte(body)[:size]); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func TestHandMadeGoodBundle(t *testing.T) {
	es := goodEnts()
	data := tarOf(t, manifestOf(es), es, true)
	dir := t.TempDir()
	p := filepath.Join(dir, "b.tar.gz")
	os.WriteFile(p, data, 0o644)
	if _, err := Unpack(context.Background(), p, sum(data), "amd64", filepath.Join(dir, "blue"), Limits{}); err != nil {
		t.Fatalf("the test's own valid bundle is refused: %v", err)
	}
}

// refused runs Unpack on data and checks the error, and that nothing is
// left: neither dest nor its staging directory nor anything an entry named.
func refused(t *testing.T, data []byte, wantSHA, wantArch string, lim Limits, want string, wantInvalid bool) {
	t.Helper()
	dir := t.TempDir()
	p := filepath.Join(dir, "b.tar.gz")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	dest := filepath.Join(dir, "releases", "green")
	os.Mkdir(filepath.Dir(dest), 0o755)
	_, err := Unpack(context.Background(), p, wantSHA, wantArch, dest, lim)
	if err == nil {
		t.Fatalf("Unpack accepted it")
	}
	t.Logf("error: %v", err)
	if errors.Is(err, ErrInvalid) != wantInvalid {
		t.Errorf("errors.Is(err, ErrInvalid) = %v, want %v", !wantInvalid, wantInvalid)
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error does not say %q", want)
	}
	left, _ := os.ReadDir(filepath.Dir(dest))
	if len(left) != 0 {
		t.Errorf("left behind in %s: %v", filepath.Dir(dest), left)
	}
	if all, _ := os.ReadDir(dir); len(all) != 2 {
		t.Errorf("%s holds %v, want only the bundle and releases/", dir, all)
	}
}

func TestUnpackRefusesEntries(t *testing.T) {
	listed := func(es []ent) *Manifest { return manifestOf(es) }
	cases := map[string]struct {
		extra []ent // appended to goodEnts
		edit  func(m *Manifest, es []ent) []ent
		noMan bool
		plain bool // a plain tar instead of gzip
		want  string
	}{
		"dot-dot entry":  {extra: []ent{{name: "../evil", body: "x", mode: 0o644}}, want: `"../evil" holds ".."`},
		"dot-dot inside": {extra: []ent{{name: "units/../kubeslot-x", body: "x", mode: 0o644}}, want: `holds ".."`},
		"absolute path":  {extra: []ent{{name: "/tmp/evil", body: "x", mode: 0o644}}, want: "absolute"},
		// The same names left out of the manifest: refused by the entry
		// check, not by the manifest's validation.
		"dot-dot entry unlisted": {extra: []ent{{name: "units/../../evil", body: "x", mode: 0o644, unlisted: true}}, want: `holds ".."`},
		"absolute path unlisted": {extra: []ent{{name: "/tmp/evil", body: "x", mode: 0o644, unlisted: true}}, want: "absolute"},
		"setuid header": {edit: func(m *Manifest, es []ent) []ent { es[0].mode = 0o4755; return es },
			want: "mode 04755, manifest says 0755"},
		"symlink escaping":      {extra: []ent{{name: "units/evil.service", typ: tar.TypeSymlink, link: "../../../etc/passwd"}}, want: "symbolic link"},
		"symlink absolute":      {extra: []ent{{name: "evil", typ: tar.TypeSymlink, link: "/etc/passwd"}}, want: "symbolic link"},
		"symlink non-escaping":  {extra: []ent{{name: "kubeslot-alias", typ: tar.TypeSymlink, link: "kubeslot"}}, want: "symbolic link"},
		"hard link":             {extra: []ent{{name: "kubeslot-alias", typ: tar.TypeLink, link: "kubeslot"}}, want: "hard link"},
		"hard link outside":     {extra: []ent{{name: "kubeslot-alias", typ: tar.TypeLink, link: "/etc/shadow"}}, want: "hard link"},
		"char device":           {extra: []ent{{name: "null", typ: tar.TypeChar}}, want: "device"},
		"block device":          {extra: []ent{{name: "sda", typ: tar.TypeBlock}}, want: "device"},
		"fifo":                  {extra: []ent{{name: "pipe", typ: tar.TypeFifo}}, want: "FIFO"},
		"other directory":       {extra: []ent{{name: "etc/", typ: tar.TypeDir, mode: 0o755}}, want: "the only directory"},
		"too deep":              {extra: []ent{{name: "units/sub/x.service", body: "x", mode: 0o644}}, want: "no deeper"},
		"unlisted extra file":   {extra: []ent{{name: "kubeslot-extra", body: "x", mode: 0o755, unlisted: true}}, want: "not in the manifest"},
		"duplicate file":        {extra: []ent{{name: "kubeslot", body: "#!/bin/sh\necho kubeslot\n", mode: 0o755, unlisted: true}}, want: "appears twice"},
		"duplicate units dir":   {extra: []ent{{name: "units/", typ: tar.TypeDir, mode: 0o755}}, want: "appears twice"},
		"manifest twice":        {extra: []ent{{name: ManifestName, body: "{}", mode: 0o644, unlisted: true}}, want: "reserved"},
		"dot-slash name":        {extra: []ent{{name: "./kubeslot-x", body: "x", mode: 0o644}}, want: "not clean"},
		"setuid file":           {extra: []ent{{name: "kubeslot-x", body: "x", mode: 0o4755}}, want: "only permission bits"},
		"global pax header":     {extra: []ent{{name: "g", typ: tar.TypeXGlobalHeader}}, want: "entry type"},
		"no manifest":           {noMan: true, want: "first entry must be the regular file manifest.json"},
		"missing binary":        {edit: dropBinary, want: "binary kubeslot-watcher is missing"},
		"listed file not there": {edit: func(m *Manifest, es []ent) []ent { return es[:len(es)-1] }, want: "not in the archive"},
		"manifest sha differs": {edit: func(m *Manifest, es []ent) []ent {
			m.Files[0].SHA256 = strings.Repeat("ab", 32)
			return es
		}, want: "manifest says abab"},
		"manifest size differs": {edit: func(m *Manifest, es []ent) []ent { m.Files[1].Size++; return es }, want: "manifest says"},
		"manifest mode differs": {edit: func(m *Manifest, es []ent) []ent { m.Files[2].Mode = 0o700; return es }, want: "mode 0755, manifest says 0700"},
		"non-executable binary": {edit: func(m *Manifest, es []ent) []ent { m.Files[2].Mode = 0o644; return es }, want: "is not executable"},
		"wrong arch in manifest": {edit: func(m *Manifest, es []ent) []ent { m.Arch = "arm64"; return es },
			want: `arch: "arm64", want "amd64"`},
		"unknown manifest field": {edit: func(m *Manifest, es []ent) []ent { return es }, want: "unknown field"},
		"plain tar":              {plain: true, want: "not a gzip stream"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			es := append(goodEnts(), c.extra...)
			m := listed(es)
			if c.edit != nil {
				es = c.edit(m, es)
			}
			if c.noMan {
				m = nil
			}
			var data []byte
			if name == "unknown manifest field" {
				data = withManifestJSON(t, es, `{"version":"v1","arch":"amd64","created":"2026-01-02T03:04:05Z","files":[],"signature":"x"}`)
			} else {
				data = tarOf(t, m, es, !c.plain)
			}
			refused(t, data, sum(data), "amd64", Limits{}, c.want, true)
		})
	}
}

func dropBinary(m *Manifest, es []ent) []ent {
	m.Files = slices.DeleteFunc(m.Files, func(f File) bool { return f.Path == "kubeslot-watcher" })
	return slices.DeleteFunc(es, func(e ent) bool { return e.name == "kubeslot-watcher" })
}

// withManifestJSON writes es after a manifest.json with the given text.
func withManifestJSON(t *testing.T, es []ent, manifest string) []byte {
	return tarOf(t, nil, append([]ent{{name: ManifestName, body: manifest, mode: 0o644}}, es...), true)
}

func TestUnpackRefusesFiles(t *testing.T) {
	good, goodSum, _ := create(t)
	data, _ := os.ReadFile(good)

	t.Run("checksum mismatch", func(t *testing.T) {
		other := strings.Repeat("0", 64)
		refused(t, data, other, "", Limits{}, "sha256 "+goodSum+", expected "+other, true)
	})
	t.Run("wrong arch", func(t *testing.T) {
		refused(t, data, goodSum, "arm64", Limits{}, `arch: "amd64", want "arm64"`, true)
	})
	for _, cut := range []int{1, 10, 200, len(data) / 2, len(data) - 30, len(data) - 4, len(data) - 1} {
		t.Run("truncated", func(t *testing.T) {
			// No expected sha256, so the reader itself must notice.
			refused(t, data[:cut], "", "", Limits{}, "truncated", true)
		})
	}
	t.Run("truncated with sha", func(t *testing.T) {
		refused(t, data[:len(data)/2], goodSum, "", Limits{}, "expected "+goodSum, true)
	})
	t.Run("empty file", func(t *testing.T) { refused(t, nil, "", "", Limits{}, "empty file", true) })
	t.Run("corrupt gzip", func(t *testing.T) {
		bad := bytes.Clone(data)
		bad[len(bad)/2] ^= 0xff
		refused(t, bad, "", "", Limits{}, "invalid bundle", true)
	})
	t.Run("data after the archive", func(t *testing.T) {
		var extra bytes.Buffer
		zw := gzip.NewWriter(&extra)
		zw.Write([]byte("more"))
		zw.Close()
		refused(t, append(bytes.Clone(data), extra.Bytes()...), "", "", Limits{}, "data after the end of the tar archive", true)
	})
	t.Run("compressed over MaxSize", func(t *testing.T) {
		refused(t, data, goodSum, "", Limits{MaxSize: int64(len(data)) - 1}, "over the limit", true)
	})
	t.Run("unpacked over MaxSize", func(t *testing.T) {
		// 2 MiB of zeros compresses to a few KiB.
		es := append(goodEnts(), ent{name: "units/big.service", body: strings.Repeat("\x00", 2<<20), mode: 0o644})
		bomb := tarOf(t, manifestOf(es), es, true)
		if len(bomb) > 64<<10 {
			t.Fatalf("test bundle is %d bytes compressed", len(bomb))
		}
		refused(t, bomb, "", "", Limits{MaxSize: 1 << 20}, "over the limit of 1048576", true)
	})
	t.Run("header larger than the manifest says", func(t *testing.T) {
		es := goodEnts()
		m := manifestOf(es)
		es[0].size = 3 << 20
		refused(t, tarOf(t, m, es, true), "", "", Limits{}, "size 3145728, manifest says", true)
	})
	t.Run("bad expected sha256", func(t *testing.T) {
		refused(t, data, "ABC", "", Limits{}, `sha256 "ABC"`, false)
	})
}

func TestUnpackDestination(t *testing.T) {
	good, goodSum, _ := create(t)
	ctx := context.Background()

	t.Run("dest exists", func(t *testing.T) {
		dest := filepath.Join(t.TempDir(), "green")
		write(t, filepath.Join(dest, "keep"), "mine", 0o644)
		_, err := Unpack(ctx, good, goodSum, "", dest, Limits{})
		if err == nil || errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "already exists") {
			t.Fatalf("err = %v, want a non-content error saying dest exists", err)
		}
		if b, err := os.ReadFile(filepath.Join(dest, "keep")); err != nil || string(b) != "mine" {
			t.Errorf("dest was touched: %q, %v", b, err)
		}
		if _, err := os.Lstat(dest + ".partial"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("staging directory made: %v", err)
		}
	})
	t.Run("dest is a dangling link", func(t *testing.T) {
		dest := filepath.Join(t.TempDir(), "green")
		os.Symlink("/nonexistent", dest)
		if _, err := Unpack(ctx, good, goodSum, "", dest, Limits{}); err == nil || !strings.Contains(err.Error(), "already exists") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("relative dest", func(t *testing.T) {
		if _, err := Unpack(ctx, good, goodSum, "", "green", Limits{}); err == nil || !strings.Contains(err.Error(), "absolute") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("stale partial is replaced", func(t *testing.T) {
		dest := filepath.Join(t.TempDir(), "green")
		write(t, filepath.Join(dest+".partial", "units", "stale.service"), "old", 0o644)
		write(t, filepath.Join(dest+".partial", "kubeslot"), "old", 0o755)
		if _, err := Unpack(ctx, good, goodSum, "amd64", dest, Limits{}); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(dest, "units", "stale.service")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("stale file carried over: %v", err)
		}
		if _, err := os.Lstat(dest + ".partial"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("staging directory left: %v", err)
		}
	})
	t.Run("canceled", func(t *testing.T) {
		dest := filepath.Join(t.TempDir(), "green")
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := Unpack(cctx, good, goodSum, "", dest, Limits{})
		if !errors.Is(err, context.Canceled) || errors.Is(err, ErrInvalid) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		for _, p := range []string{dest, dest + ".partial"} {
			if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s left: %v", p, err)
			}
		}
	})
}
