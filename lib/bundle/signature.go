package bundle

import (
	"bufio"
	"fmt"
	"io"
	"os"

	"aead.dev/minisign"

	"github.com/kubeslot/kubeslot/lib/releasekey"
)

// SignatureSuffix is what a bundle's detached signature adds to its name
// or URL: minisign's own file name (`minisign -S -m <bundle>` writes it).
const SignatureSuffix = ".minisig"

// maxSignature bounds a signature file: minisign's are a few hundred bytes.
const maxSignature = 16 << 10

// ReadSignature reads a detached signature, bounded.
func ReadSignature(r io.Reader) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxSignature+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxSignature {
		return nil, fmt.Errorf("%w: signature over %d bytes", ErrInvalid, maxSignature)
	}
	return b, nil
}

// VerifySignature checks that sig is a signature of the file at path by one
// of keys (releasekey.Parse's form) and returns that key's ID (hex). The signature
// is minisign's prehashed kind, which `minisign -S` makes; the file is read
// once, streaming: a bundle is verified before anything of it is
// unpacked, and a signature that names no trusted key fails as one that
// does not verify (wrapping ErrInvalid).
func VerifySignature(path string, sig []byte, keys []string) (string, error) {
	if len(keys) == 0 {
		return "", fmt.Errorf("%w: no trusted key to verify the signature with", ErrInvalid)
	}
	pubs := make([]minisign.PublicKey, 0, len(keys))
	for i, s := range keys {
		k, err := releasekey.Parse(s)
		if err != nil {
			return "", fmt.Errorf("trusted key %d: %w", i+1, err)
		}
		pubs = append(pubs, k)
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	r := minisign.NewReader(bufio.NewReaderSize(f, 1<<20))
	if _, err := io.Copy(io.Discard, r); err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	for _, k := range pubs {
		if r.Verify(k, sig) {
			return fmt.Sprintf("%016X", k.ID()), nil
		}
	}
	return "", fmt.Errorf("%w: %s is not signed by a trusted key (%d trusted; its signature does not verify with any)", ErrInvalid, path, len(pubs))
}
