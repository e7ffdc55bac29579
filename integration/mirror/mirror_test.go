package mirror

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func get(t *testing.T, url string) (int, []byte, error) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

func TestServeAddAndFaults(t *testing.T) {
	data := bytes.Repeat([]byte("kubeslot-"), 100000) // 900 kB
	src := filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Start(filepath.Join(t.TempDir(), "srv"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	sum, err := s.Add("images/blob.bin", src)
	if err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256(data)
	if sum != hex.EncodeToString(want[:]) {
		t.Fatalf("Add returned %s, want %x", sum, want)
	}

	code, body, err := get(t, s.URL("images/blob.bin"))
	if err != nil || code != 200 || !bytes.Equal(body, data) {
		t.Fatalf("plain GET: code %d, %d bytes, err %v", code, len(body), err)
	}
	code, body, _ = get(t, s.URL("images/blob.bin.sha256"))
	if code != 200 || string(body) != sum+"  blob.bin\n" {
		t.Fatalf("sha256 file: code %d, %q", code, body)
	}
	if code, _, _ := get(t, s.URL("../../etc/passwd")); code != 404 {
		t.Fatalf("path outside the directory: code %d, want 404", code)
	}
	if code, _, _ := get(t, s.URL("images/missing")); code != 404 {
		t.Fatalf("missing file: code %d, want 404", code)
	}

	s.SetFault("images/blob.bin", Truncate)
	_, body, err = get(t, s.URL("images/blob.bin"))
	if !errors.Is(err, io.ErrUnexpectedEOF) || len(body) >= len(data) {
		t.Fatalf("Truncate: %d bytes, err %v; want fewer bytes and unexpected EOF", len(body), err)
	}

	s.SetFault("images/blob.bin", Corrupt)
	code, body, err = get(t, s.URL("images/blob.bin"))
	if err != nil || code != 200 || len(body) != len(data) || bytes.Equal(body, data) {
		t.Fatalf("Corrupt: code %d, %d bytes, equal=%v, err %v", code, len(body), bytes.Equal(body, data), err)
	}

	s.SetFault("images/blob.bin", None)
	if _, body, _ := get(t, s.URL("images/blob.bin")); !bytes.Equal(body, data) {
		t.Fatal("after None: content differs")
	}
	if n := s.Hits("images/blob.bin"); n != 4 {
		t.Fatalf("Hits = %d, want 4", n)
	}
	if !strings.HasPrefix(s.URL("x"), "http://127.0.0.1:") {
		t.Fatalf("URL %s not on loopback", s.URL("x"))
	}
}

// The https listener serves the same files under the server's own CA, and
// a client without that CA is refused.
func TestServeTLS(t *testing.T) {
	src := filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(src, []byte("kubelet"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Start(filepath.Join(t.TempDir(), "srv"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sum, err := s.Add("release/v1.37.2/kubelet", src)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get(s.TLSURL("release/v1.37.2/kubelet")); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("without the CA: %v, want a certificate error", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(s.CAPEM())) {
		t.Fatal("CAPEM holds no certificate")
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := c.Get(s.TLSURL("release/v1.37.2/kubelet.sha256"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.HasPrefix(string(b), sum) || s.Hits("release/v1.37.2/kubelet.sha256") != 1 {
		t.Errorf("over https: %q, %d hits", b, s.Hits("release/v1.37.2/kubelet.sha256"))
	}
	if !strings.HasPrefix(s.TLSURL("x"), "https://"+s.TLSAddr()+"/") || s.TLSAddr() == s.Addr() {
		t.Errorf("TLSURL %s, TLSAddr %s, Addr %s", s.TLSURL("x"), s.TLSAddr(), s.Addr())
	}
}
