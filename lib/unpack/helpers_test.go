package unpack

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// ent is one archive entry for the tests. typ defaults to a regular file.
type ent struct {
	name     string
	typ      byte
	mode     int64
	body     string
	link     string
	uid, gid int
	mtime    time.Time
}

var epoch = time.Date(2021, 3, 4, 5, 6, 7, 0, time.UTC)

func dirE(name string, mode int64) ent { return ent{name: name, typ: tar.TypeDir, mode: mode} }
func fileE(name, body string) ent      { return ent{name: name, body: body, mode: 0o644} }
func symE(name, target string) ent {
	return ent{name: name, typ: tar.TypeSymlink, link: target, mode: 0o777}
}
func linkE(name, target string) ent     { return ent{name: name, typ: tar.TypeLink, link: target} }
func withMode(e ent, mode int64) ent    { e.mode = mode; return e }
func withOwner(e ent, uid, gid int) ent { e.uid, e.gid = uid, gid; return e }
func withTime(e ent, tm time.Time) ent  { e.mtime = tm; return e }
func withType(e ent, typ byte) ent      { e.typ = typ; return e }

// tarball builds an archive in memory.
func tarball(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mt := e.mtime
		if mt.IsZero() {
			mt = epoch
		}
		h := &tar.Header{
			Name: e.name, Typeflag: typ, Mode: e.mode, Linkname: e.link,
			Uid: e.uid, Gid: e.gid, ModTime: mt, Format: tar.FormatPAX,
		}
		if typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("header %s: %v", e.name, err)
		}
		if typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func gz(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// sandbox is a temp dir holding dest and a sentinel directory beside it
// that no extraction may touch.
type sandbox struct {
	top, dest, sentinel string
}

func newSandbox(t *testing.T) sandbox {
	t.Helper()
	top := t.TempDir()
	s := sandbox{top: top, dest: filepath.Join(top, "dest"), sentinel: filepath.Join(top, "sentinel")}
	if err := os.Mkdir(s.sentinel, 0o755); err != nil {
		t.Fatal(err)
	}
	return s
}

// checkOutside fails if anything appeared outside dest: in the sentinel,
// or next to dest.
func (s sandbox) checkOutside(t *testing.T, allowed ...string) {
	t.Helper()
	es, err := os.ReadDir(s.sentinel)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		ok := false
		for _, a := range allowed {
			ok = ok || a == e.Name()
		}
		if !ok {
			t.Errorf("written outside dest: %s", filepath.Join(s.sentinel, e.Name()))
		}
	}
	top, err := os.ReadDir(s.top)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range top {
		if e.Name() != "dest" && e.Name() != "sentinel" {
			t.Errorf("written outside dest: %s", filepath.Join(s.top, e.Name()))
		}
	}
}

func lstat(t *testing.T, p string) (fs.FileInfo, *syscall.Stat_t) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi, fi.Sys().(*syscall.Stat_t)
}
