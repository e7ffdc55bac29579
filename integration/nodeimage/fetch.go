// Package nodeimage prepares node machines for kubeslot's whole-system
// tests: it finds or builds the cached Debian node rootfs tarball
// (scripts/node-rootfs.sh), downloads artifacts the way the agent does
// (HTTP plus a "<url>.sha256" checksum), unpacks a rootfs into a directory
// without letting the archive escape it, and writes the files a kubelet node
// needs (containerd, CNI, kubelet config and unit, .nspawn settings).
//
// Only test code under integration/ imports it.
package nodeimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// Tarball returns the path of the node rootfs tarball: $KUBESLOT_NODE_ROOTFS
// when set, else what scripts/node-rootfs.sh prints. With build false the
// script only reports the cache and an absent tarball is an error; with
// build true it debootstraps one (minutes; progress on stderr).
func Tarball(ctx context.Context, build bool) (string, error) {
	if p := os.Getenv("KUBESLOT_NODE_ROOTFS"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("nodeimage: KUBESLOT_NODE_ROOTFS: %w", err)
		}
		return p, nil
	}
	script, err := repoFile("scripts/node-rootfs.sh")
	if err != nil {
		return "", err
	}
	var args []string
	if !build {
		args = append(args, "--cached")
	}
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, script, args...)
	cmd.Stdout = &out
	cmd.Stderr = &errb
	if build {
		cmd.Stderr = io.MultiWriter(&errb, os.Stderr)
	}
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("nodeimage: %s %s: %w: %s", script, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	p := strings.TrimSpace(lines[len(lines)-1])
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("nodeimage: %s printed %q: %w", script, p, err)
	}
	return p, nil
}

// Download fetches url into dst (created with mode, replaced atomically)
// after checking its SHA-256 against the first field of url+".sha256". It
// returns the checksum. A short body, a wrong checksum or a non-200 answer
// leaves dst untouched.
func Download(ctx context.Context, client *http.Client, url, dst string, mode fs.FileMode) (string, error) {
	if client == nil {
		client = http.DefaultClient
	}
	sumText, err := get(ctx, client, url+".sha256", func(r io.Reader) ([]byte, error) {
		return io.ReadAll(io.LimitReader(r, 4096))
	})
	if err != nil {
		return "", err
	}
	fields := strings.Fields(string(sumText))
	if len(fields) == 0 || len(fields[0]) != 64 {
		return "", fmt.Errorf("nodeimage: %s.sha256: no SHA-256 in %q", url, sumText)
	}
	want := strings.ToLower(fields[0])
	if _, err := hex.DecodeString(want); err != nil {
		return "", fmt.Errorf("nodeimage: %s.sha256: %q is not hex", url, fields[0])
	}

	tmp := dst + ".part"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return "", fmt.Errorf("nodeimage: %w", err)
	}
	defer os.Remove(tmp) // a no-op once renamed
	h := sha256.New()
	_, err = get(ctx, client, url, func(r io.Reader) ([]byte, error) {
		_, err := io.Copy(io.MultiWriter(f, h), r)
		return nil, err
	})
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("nodeimage: write %s: %w", tmp, cerr)
	}
	if err != nil {
		return "", err
	}
	got := hex.EncodeToString(h.Sum(nil))
	if got != want {
		return "", fmt.Errorf("nodeimage: %s: SHA-256 %s, but %s.sha256 says %s", url, got, url, want)
	}
	if err := os.Chmod(tmp, mode); err != nil { // the umask narrowed it
		return "", fmt.Errorf("nodeimage: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return "", fmt.Errorf("nodeimage: %w", err)
	}
	return got, nil
}

func get(ctx context.Context, client *http.Client, url string, body func(io.Reader) ([]byte, error)) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("nodeimage: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("nodeimage: GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("nodeimage: GET %s: %s", url, resp.Status)
	}
	b, err := body(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("nodeimage: GET %s: body: %w", url, err)
	}
	return b, nil
}

// UnpackStats counts what Unpack did.
type UnpackStats struct {
	Files, Dirs, Symlinks, Hardlinks, Skipped int
	Bytes                                     int64
}

// Unpack extracts a gzip tarball into dir (created when missing) with
// owners, modes and setuid bits. Every path is resolved inside dir (os.Root):
// an entry or a symlink pointing outside fails instead of escaping. Device
// nodes and fifos are skipped: systemd-nspawn provides /dev.
func Unpack(ctx context.Context, tarball, dir string) (st UnpackStats, err error) {
	zr, closeZ, err := gunzip(ctx, tarball)
	if err != nil {
		return st, err
	}
	defer func() {
		if cerr := closeZ(); err == nil && cerr != nil {
			err = fmt.Errorf("nodeimage: %s: %w", tarball, cerr)
		}
	}()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return st, fmt.Errorf("nodeimage: %w", err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return st, fmt.Errorf("nodeimage: %w", err)
	}
	defer root.Close()

	type dirMeta struct {
		name     string
		mode     fs.FileMode
		uid, gid int
	}
	var dirs []dirMeta // applied last: a read-only dir would refuse its own entries
	tr := tar.NewReader(zr)
	for {
		if err := ctx.Err(); err != nil {
			return st, fmt.Errorf("nodeimage: unpack %s: %w", tarball, err)
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return st, fmt.Errorf("nodeimage: %s: %w", tarball, err)
		}
		name := strings.TrimPrefix(path.Clean("/"+hdr.Name), "/")
		if name == "" {
			name = "."
		}
		fail := func(err error) (UnpackStats, error) {
			return st, fmt.Errorf("nodeimage: %s: entry %q: %w", tarball, hdr.Name, err)
		}
		mode := hdr.FileInfo().Mode()
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o755); err != nil {
				return fail(err)
			}
			dirs = append(dirs, dirMeta{name, mode, hdr.Uid, hdr.Gid})
			st.Dirs++
		case tar.TypeReg:
			out, err := root.OpenFile(name, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
			if err != nil {
				return fail(err)
			}
			n, err := io.Copy(out, tr)
			if err == nil {
				err = out.Chown(hdr.Uid, hdr.Gid) // before Chmod: chown clears setuid
			}
			if err == nil {
				err = out.Chmod(mode)
			}
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fail(err)
			}
			st.Files++
			st.Bytes += n
		case tar.TypeSymlink:
			_ = root.Remove(name)
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return fail(err)
			}
			if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
				return fail(err)
			}
			st.Symlinks++
		case tar.TypeLink:
			target := strings.TrimPrefix(path.Clean("/"+hdr.Linkname), "/")
			_ = root.Remove(name)
			if err := root.Link(target, name); err != nil {
				return fail(err)
			}
			st.Hardlinks++
		default:
			st.Skipped++
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		d := dirs[i]
		if err := root.Chown(d.name, d.uid, d.gid); err != nil {
			return st, fmt.Errorf("nodeimage: %s: dir %q: %w", tarball, d.name, err)
		}
		if err := root.Chmod(d.name, d.mode); err != nil {
			return st, fmt.Errorf("nodeimage: %s: dir %q: %w", tarball, d.name, err)
		}
	}
	return st, nil
}

// gunzip streams the decompressed tarball. The gzip tool when there is one:
// it is ~15x faster than compress/gzip under the race detector, which the
// rig's tests run with (a 120 MB rootfs: ~3 s instead of ~35 s).
func gunzip(ctx context.Context, tarball string) (io.Reader, func() error, error) {
	if gz, err := exec.LookPath("gzip"); err == nil {
		cmd := exec.CommandContext(ctx, gz, "-dc", "--", tarball)
		var errb bytes.Buffer
		cmd.Stderr = &errb
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, nil, fmt.Errorf("nodeimage: %w", err)
		}
		if err := cmd.Start(); err != nil {
			return nil, nil, fmt.Errorf("nodeimage: %s: %w", gz, err)
		}
		return out, func() error {
			// drain, so that gzip can finish and report a corrupt tail
			_, _ = io.Copy(io.Discard, out)
			if err := cmd.Wait(); err != nil {
				return fmt.Errorf("gzip -dc: %w: %s", err, bytes.TrimSpace(errb.Bytes()))
			}
			return nil
		}, nil
	}
	f, err := os.Open(tarball)
	if err != nil {
		return nil, nil, fmt.Errorf("nodeimage: %w", err)
	}
	zr, err := gzip.NewReader(f)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("nodeimage: %s: %w", tarball, err)
	}
	return zr, func() error {
		_, err := io.Copy(io.Discard, zr) // reach the gzip trailer: its CRC check
		return errors.Join(err, f.Close())
	}, nil
}

// repoFile finds rel in this repository by walking up from the working
// directory to the go.mod of github.com/kubeslot/kubeslot.
func repoFile(rel string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("nodeimage: %w", err)
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(b, []byte("module github.com/kubeslot/kubeslot\n")) {
			return filepath.Join(dir, filepath.FromSlash(rel)), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("nodeimage: not inside the kubeslot repository")
		}
		dir = parent
	}
}
