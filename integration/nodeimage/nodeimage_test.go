package nodeimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type entry struct {
	hdr  tar.Header
	body string
}

func writeTarball(t *testing.T, entries []entry) string {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		h := e.hdr
		h.Size = int64(len(e.body))
		h.Uid, h.Gid = os.Getuid(), os.Getgid()
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "rootfs.tar.gz")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestUnpack(t *testing.T) {
	tb := writeTarball(t, []entry{
		{hdr: tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755}},
		{hdr: tar.Header{Name: "./usr/bin/", Typeflag: tar.TypeDir, Mode: 0o755}},
		{hdr: tar.Header{Name: "./usr/bin/tool", Typeflag: tar.TypeReg, Mode: 0o4755}, body: "#!/bin/sh\n"},
		{hdr: tar.Header{Name: "./bin", Typeflag: tar.TypeSymlink, Linkname: "usr/bin"}},
		{hdr: tar.Header{Name: "./usr/bin/tool2", Typeflag: tar.TypeLink, Linkname: "./usr/bin/tool"}},
		{hdr: tar.Header{Name: "./etc/", Typeflag: tar.TypeDir, Mode: 0o555}},
		{hdr: tar.Header{Name: "./etc/motd", Typeflag: tar.TypeReg, Mode: 0o644}, body: "hi\n"},
		{hdr: tar.Header{Name: "./dev/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}},
	})
	dir := filepath.Join(t.TempDir(), "node")
	st, err := Unpack(context.Background(), tb, dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Files != 2 || st.Dirs != 3 || st.Symlinks != 1 || st.Hardlinks != 1 || st.Skipped != 1 {
		t.Errorf("stats %+v", st)
	}
	fi, err := os.Stat(filepath.Join(dir, "bin/tool")) // through the symlink
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSetuid == 0 || fi.Mode().Perm() != 0o755 {
		t.Errorf("usr/bin/tool mode %v, want setuid 0755", fi.Mode())
	}
	if fi2, err := os.Stat(filepath.Join(dir, "usr/bin/tool2")); err != nil || !os.SameFile(fi, fi2) {
		t.Errorf("tool2 is not a hard link of tool: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "etc")); err != nil || fi.Mode().Perm() != 0o555 {
		t.Errorf("etc: %v %v, want 0555 applied after its entries", fi.Mode(), err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "dev/null")); err == nil {
		t.Error("device node was created")
	}
	os.Chmod(filepath.Join(dir, "etc"), 0o755) // let t.TempDir clean up as non-root
}

func TestUnpackRefusesEscape(t *testing.T) {
	for name, entries := range map[string][]entry{
		"symlink then write through it": {
			{hdr: tar.Header{Name: "./esc", Typeflag: tar.TypeSymlink, Linkname: "/tmp"}},
			{hdr: tar.Header{Name: "./esc/pwned", Typeflag: tar.TypeReg, Mode: 0o644}, body: "x"},
		},
		"hard link to outside": {
			{hdr: tar.Header{Name: "./passwd", Typeflag: tar.TypeLink, Linkname: "../../../../etc/passwd"}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "node")
			if _, err := Unpack(context.Background(), writeTarball(t, entries), dir); err == nil {
				t.Fatal("Unpack succeeded; want an escape error")
			}
			if _, err := os.Stat("/tmp/pwned"); err == nil {
				t.Fatal("/tmp/pwned was written outside the root")
			}
		})
	}
}

func TestDownloadChecksSHA256(t *testing.T) {
	body := strings.Repeat("artifact ", 1000)
	sum := sha256.Sum256([]byte(body))
	good := hex.EncodeToString(sum[:])
	sha := good
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/a":
			w.Write([]byte(body))
		case "/a.sha256":
			w.Write([]byte(sha + "  a\n"))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	dst := filepath.Join(t.TempDir(), "a")
	got, err := Download(context.Background(), nil, srv.URL+"/a", dst, 0o755)
	if err != nil || got != good {
		t.Fatalf("Download = %s, %v", got, err)
	}
	if fi, err := os.Stat(dst); err != nil || fi.Mode().Perm() != 0o755 || fi.Size() != int64(len(body)) {
		t.Fatalf("dst: %v %v", fi, err)
	}

	sha = strings.Repeat("0", 64)
	dst2 := filepath.Join(t.TempDir(), "b")
	if _, err := Download(context.Background(), nil, srv.URL+"/a", dst2, 0o644); err == nil || !strings.Contains(err.Error(), "SHA-256") {
		t.Fatalf("wrong checksum: err %v", err)
	}
	if _, err := os.Stat(dst2); err == nil {
		t.Fatal("a download with a wrong checksum left the file")
	}
	if _, err := os.Stat(dst2 + ".part"); err == nil {
		t.Fatal("a failed download left its .part file")
	}
	if _, err := Download(context.Background(), nil, srv.URL+"/missing", dst2, 0o644); err == nil {
		t.Fatal("404: no error")
	}
}

func TestWriteFiles(t *testing.T) {
	dir := t.TempDir()
	n := Node{Name: "node-1", CAPEM: []byte("CA"), BootstrapKubeconfig: []byte("kc"), KubeletPort: 21001, HealthzPort: 21002}
	if err := WriteFiles(dir, n); err != nil {
		t.Fatal(err)
	}
	if err := WriteFiles(dir, n); err != nil { // again: read-only machine-id is replaced
		t.Fatalf("second WriteFiles: %v", err)
	}
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	unit := read("etc/systemd/system/kubelet.service")
	for _, want := range []string{"--hostname-override=node-1", "BindReadOnlyPaths=/dev/null:/dev/kmsg",
		"BindReadOnlyPaths=/etc/kubernetes/sysctl/vm_overcommit_memory:/proc/sys/vm/overcommit_memory"} {
		if !strings.Contains(unit, want) {
			t.Errorf("kubelet unit lacks %q:\n%s", want, unit)
		}
	}
	if got := read("etc/kubernetes/sysctl/kernel_panic"); got != "10\n" {
		t.Errorf("kernel.panic file %q", got)
	}
	cfg := read("etc/kubernetes/kubelet-config.yaml")
	for _, want := range []string{"port: 21001", "healthzPort: 21002", "failCgroupV1: false", "makeIPTablesUtilChains: false"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("kubelet config lacks %q", want)
		}
	}
	if id := strings.TrimSpace(read("etc/machine-id")); len(id) != 32 {
		t.Errorf("machine-id %q", id)
	}
	if err := WriteFiles(dir, Node{Name: "../x"}); err == nil {
		t.Error("a bad name was accepted")
	}
}
