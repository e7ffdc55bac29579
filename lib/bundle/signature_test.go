package bundle

import (
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"aead.dev/minisign"
)

// A bundle signed by a trusted key verifies, naming the key; one signed by
// another key, a changed bundle, or no trusted key at all does not, with
// ErrInvalid; a key is read from its base64 line or its whole .pub file.
func TestVerifySignature(t *testing.T) {
	pub, priv, err := minisign.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	otherPub, otherPriv, err := minisign.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "b.tar.gz")
	data := []byte(strings.Repeat("bundle bytes ", 100000))
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	sign := func(k minisign.PrivateKey, b []byte) []byte {
		r := minisign.NewReader(strings.NewReader(string(b)))
		if _, err := io.Copy(io.Discard, r); err != nil {
			t.Fatal(err)
		}
		return r.Sign(k) // prehashed, as the minisign command signs
	}
	sig := sign(priv, data)
	pubText, _ := pub.MarshalText()
	otherText, _ := otherPub.MarshalText()
	pubFile := "untrusted comment: minisign public key\n" + string(pubText) + "\n"

	if id, err := VerifySignature(path, sig, []string{string(otherText), pubFile}); err != nil || id != strings.ToUpper(id) || len(id) != 16 {
		t.Errorf("signed by the second trusted key: %q, %v", id, err)
	}
	if _, err := VerifySignature(path, sign(otherPriv, data), []string{string(pubText)}); !errors.Is(err, ErrInvalid) {
		t.Errorf("signed by an untrusted key: %v", err)
	}
	if err := os.WriteFile(path, append(data, '!'), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := VerifySignature(path, sig, []string{string(pubText)}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "not signed by a trusted key") {
		t.Errorf("a changed bundle: %v", err)
	}
	if _, err := VerifySignature(path, sig, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("no trusted key: %v", err)
	}
}
