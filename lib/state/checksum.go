// Package state persists kubeslot's durable state in the host root: the
// configuration applied to each slot, which slot is active, and the
// checksummed files that guard them against torn writes and hand edits.
//
// Files are replaced atomically (lib/atomicfile) and carry a sha256 sidecar in
// sha256sum format, so `sha256sum -c` checks them by hand too. A file whose
// sidecar is missing or disagrees is an error that names the file and says
// what to do; it is never trusted silently. Imported by the stage binaries
// and the kubeslot CLI.
package state

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
)

// SidecarSuffix is appended to a file's name to name its checksum file.
const SidecarSuffix = ".sha256"

// ErrNotFound is returned (wrapped) when a checksummed file does not exist.
var ErrNotFound = errors.New("not found")

// CorruptError reports a checksummed file that cannot be trusted.
type CorruptError struct {
	Path   string
	Reason string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("%s: %s: not trusted; if a stage was interrupted, re-run it; otherwise reset the host (kubeslot-resetter)", e.Path, e.Reason)
}

// WriteChecksummed writes data to path and its sha256 to the sidecar, both
// atomically. The data goes first: a crash between the two writes leaves a
// mismatch that ReadChecksummed reports, never a silently wrong file.
func WriteChecksummed(path string, data []byte, perm fs.FileMode) error {
	if err := atomicfile.WriteFile(path, data, perm); err != nil {
		return err
	}
	sum := sha256.Sum256(data)
	line := hex.EncodeToString(sum[:]) + "  " + filepath.Base(path) + "\n"
	return atomicfile.WriteFile(path+SidecarSuffix, []byte(line), perm)
}

// ReadChecksummed reads path and verifies it against its sidecar.
func ReadChecksummed(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(path + SidecarSuffix); serr == nil {
			return nil, &CorruptError{Path: path, Reason: "missing, but its checksum file " + filepath.Base(path) + SidecarSuffix + " exists"}
		}
		return nil, fmt.Errorf("%s: %w", path, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	side, err := os.ReadFile(path + SidecarSuffix)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, &CorruptError{Path: path, Reason: "checksum file " + filepath.Base(path) + SidecarSuffix + " is missing"}
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path+SidecarSuffix, err)
	}
	fields := strings.Fields(string(side))
	if len(fields) == 0 || len(fields[0]) != sha256.Size*2 {
		return nil, &CorruptError{Path: path, Reason: "checksum file " + filepath.Base(path) + SidecarSuffix + " is malformed"}
	}
	want, err := hex.DecodeString(fields[0])
	if err != nil {
		return nil, &CorruptError{Path: path, Reason: "checksum file " + filepath.Base(path) + SidecarSuffix + " is malformed"}
	}
	got := sha256.Sum256(data)
	if !bytes.Equal(want, got[:]) {
		return nil, &CorruptError{Path: path, Reason: fmt.Sprintf("checksum mismatch (file has sha256 %x…, %s says %x…; torn write or edited by hand)", got[:6], filepath.Base(path)+SidecarSuffix, want[:6])}
	}
	return data, nil
}

// RemoveChecksummed removes a file and its sidecar (sidecar last, so an
// interrupted removal still reads as damaged rather than valid).
func RemoveChecksummed(path string) error {
	if err := atomicfile.Remove(path); err != nil {
		return err
	}
	return atomicfile.Remove(path + SidecarSuffix)
}
