package bundle

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
)

// maxManifest bounds manifest.json: a few hundred bytes per file.
const maxManifest = 1 << 20

// versionRE is what a release version may look like: it becomes part of
// file names (kubeslot-<version>-<arch>.tar.gz) and of status reports.
var versionRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.+_~-]{0,127}$`)

// sha256RE is a sha256 as manifests write it: lowercase hex.
var sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// knownArch are the GOARCH values a bundle may name.
var knownArch = []string{
	"386", "amd64", "arm", "arm64", "loong64", "mips", "mipsle", "mips64", "mips64le",
	"ppc64", "ppc64le", "riscv64", "s390x",
}

// CheckVersion says whether v can be a release version: letters, digits and
// . + - _ ~, starting with a letter or digit, at most 128 characters.
func CheckVersion(v string) error {
	if !versionRE.MatchString(v) {
		return invalid("version %q: want 1 to 128 letters, digits and . + - _ ~, starting with a letter or digit", v)
	}
	return nil
}

// CheckArch says whether a is an architecture a bundle may name (a GOARCH).
func CheckArch(a string) error {
	if !slices.Contains(knownArch, a) {
		return invalid("architecture %q: want a GOARCH (%s)", a, strings.Join(knownArch, ", "))
	}
	return nil
}

// CheckSHA256 says whether s is a sha256 as bundles write it (64 lowercase
// hex digits).
func CheckSHA256(s string) error {
	if !sha256RE.MatchString(s) {
		return fmt.Errorf("sha256 %q: want 64 lowercase hex digits", s)
	}
	return nil
}

// checkPath says whether p may be a file of a bundle: clean, relative,
// slash-separated, at the top or directly in units/, and not a name the
// layout reserves.
func checkPath(p string) error {
	switch {
	case p == "":
		return errors.New("empty path")
	case strings.HasPrefix(p, "/"):
		return fmt.Errorf("path %q is absolute", p)
	case slices.Contains(strings.Split(p, "/"), ".."):
		return fmt.Errorf("path %q holds \"..\"", p)
	case path.Clean(p) != p || p == ".":
		return fmt.Errorf("path %q is not clean (want %q)", p, path.Clean(p))
	case strings.ContainsFunc(p, func(r rune) bool { return r < 0x20 || r == 0x7f || r == '\\' }):
		return fmt.Errorf("path %q holds a control character or a backslash", p)
	case p == ManifestName || p == UnitsDir:
		return fmt.Errorf("path %q is reserved", p)
	}
	if dir, _, ok := strings.Cut(p, "/"); ok && (dir != UnitsDir || strings.Count(p, "/") > 1) {
		return fmt.Errorf("path %q: files are at the top or in %s/, no deeper", p, UnitsDir)
	}
	return nil
}

// validate checks the manifest on its own: version, architecture, and every
// file's path, sha256, size and mode; no path twice.
func (m *Manifest) validate() error {
	if err := CheckVersion(m.Version); err != nil {
		return err
	}
	if err := CheckArch(m.Arch); err != nil {
		return err
	}
	if m.Created.IsZero() {
		return invalid("created: missing")
	}
	seen := make(map[string]bool, len(m.Files))
	for i, f := range m.Files {
		if err := checkPath(f.Path); err != nil {
			return invalid("files[%d]: %v", i, err)
		}
		if seen[f.Path] {
			return invalid("files[%d]: path %q listed twice", i, f.Path)
		}
		seen[f.Path] = true
		if err := CheckSHA256(f.SHA256); err != nil {
			return invalid("files[%d] (%s): %v", i, f.Path, err)
		}
		if f.Size < 0 {
			return invalid("files[%d] (%s): size %d is negative", i, f.Path, f.Size)
		}
		if f.Mode&^0o777 != 0 {
			return invalid("files[%d] (%s): mode %#o: only permission bits (0777) are allowed", i, f.Path, f.Mode)
		}
	}
	return nil
}

// checkRelease checks what a usable release needs beyond a valid manifest:
// the architecture (when wantArch is not empty) and every binary of
// Binaries, executable.
func (m *Manifest) checkRelease(wantArch string) error {
	if wantArch != "" && m.Arch != wantArch {
		return invalid("manifest arch: %q, want %q", m.Arch, wantArch)
	}
	for _, name := range Binaries {
		f, ok := m.File(name)
		if !ok {
			return invalid("manifest: binary %s is missing", name)
		}
		if f.Mode&0o100 == 0 {
			return invalid("manifest: binary %s: mode %#o is not executable", name, f.Mode)
		}
	}
	return nil
}

// decodeManifest parses and validates a manifest; name says where it came
// from in errors.
func decodeManifest(name string, data []byte) (*Manifest, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return nil, invalid("%s: %v", name, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, invalid("%s: data after the manifest object", name)
	}
	if err := m.validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &m, nil
}

// ReadManifest reads and validates dir's manifest.json.
func ReadManifest(dir string) (*Manifest, error) {
	p := filepath.Join(dir, ManifestName)
	// O_NOFOLLOW: a release directory's manifest is a file of its own.
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, invalid("%s is a symbolic link", p)
		}
		if errors.Is(err, fs.ErrNotExist) {
			// Both: a caller may treat a directory without a manifest
			// (a plain directory of binaries) differently.
			return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, invalid("%s is not a regular file (%s)", p, fi.Mode().Type())
	}
	data, err := io.ReadAll(io.LimitReader(f, maxManifest+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	if len(data) > maxManifest {
		return nil, invalid("%s: over %d bytes", p, maxManifest)
	}
	return decodeManifest(p, data)
}

// VerifyDir checks that the release directory dir matches its manifest:
// every listed file present with its size, sha256 and mode, nothing
// unlisted, every kubeslot binary present, the architecture wantArch (when
// not empty). It returns the manifest.
func VerifyDir(dir, wantArch string) (*Manifest, error) {
	m, err := ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	if err := m.checkRelease(wantArch); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	onDisk, err := listDir(dir)
	if err != nil {
		return nil, err
	}
	for _, p := range onDisk {
		if _, ok := m.File(p); !ok {
			return nil, invalid("%s: file %s is not in the manifest", dir, p)
		}
	}
	for _, f := range m.Files {
		if err := verifyFile(dir, f); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// verifyFile checks one listed file: a regular file (never through a link)
// with the manifest's mode, size and sha256.
func verifyFile(dir string, want File) error {
	p := filepath.Join(dir, filepath.FromSlash(want.Path))
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return invalid("%s: file %s is missing", dir, want.Path)
		case errors.Is(err, syscall.ELOOP):
			return invalid("%s: file %s is a symbolic link", dir, want.Path)
		}
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return invalid("%s: file %s is not a regular file (%s)", dir, want.Path, fi.Mode().Type())
	}
	mode := fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	if mode != fs.FileMode(want.Mode) {
		return invalid("%s: file %s: mode %v, manifest says %v", dir, want.Path, mode, fs.FileMode(want.Mode))
	}
	if fi.Size() != want.Size {
		return invalid("%s: file %s: size %d, manifest says %d", dir, want.Path, fi.Size(), want.Size)
	}
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(f, want.Size+1))
	if err != nil {
		return fmt.Errorf("read %s: %w", p, err)
	}
	if n != want.Size {
		return invalid("%s: file %s changed size while it was read (%d bytes, manifest says %d)", dir, want.Path, n, want.Size)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != want.SHA256 {
		return invalid("%s: file %s: sha256 %s, manifest says %s", dir, want.Path, sum, want.SHA256)
	}
	return nil
}
