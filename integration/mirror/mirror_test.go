package mirror

import (
	"bytes"
	"crypto/sha256"
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
