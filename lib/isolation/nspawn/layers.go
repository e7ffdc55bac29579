package nspawn

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
	"github.com/kubeslot/kubeslot/lib/unpack"
)

// artsDir holds a tree's artifact layers: <base>/cache/trees/<digest>/
// artifacts/<key>, one per artifact set (the stamp's digests), built once
// in a ".<key>.partial" directory and renamed, never modified afterwards.
// They go with their tree when the cache prunes it.
const artsDir = "artifacts"

// artifactLayer returns the key and local path of the artifact layer of
// stamp over tree (treeDir is the tree's cache directory), building it when
// it is missing. Binaries are hard links to the verified cache files where
// both are on one filesystem (then O(1), whatever their size), else copies.
// Every directory the layer has and the tree has too carries the tree's
// owner and mode: the upper lower's directory attributes are what the node
// sees, and must not mask the tree's.
func (b *Backend) artifactLayer(ctx context.Context, treeDir, tree string, src fetched, stamp Stamp) (key, local string, err error) {
	data, err := json.MarshalIndent(stamp, "", "  ")
	if err != nil {
		return "", "", err
	}
	sum := sha256.Sum256(data)
	key = hex.EncodeToString(sum[:16])
	dir := filepath.Join(treeDir, artsDir)
	final := filepath.Join(dir, key)
	if fi, err := os.Lstat(final); err == nil && fi.IsDir() {
		return key, final, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", err
	}
	partial := filepath.Join(dir, "."+key+".partial")
	if err := removeTree(partial); err != nil { // left by a kill
		return "", "", err
	}
	l := &layer{tree: tree, dir: partial}
	if err := l.mkdir(""); err != nil {
		return "", "", err
	}
	if err := l.install(src["kubelet"], nodeconfig.KubeletBinary); err != nil {
		return "", "", fmt.Errorf("kubelet: %w", err)
	}
	if p, ok := src["runc"]; ok {
		if err := l.install(p, nodeconfig.RuncBinary); err != nil {
			return "", "", fmt.Errorf("runc: %w", err)
		}
	}
	archives := []struct{ role, dest string }{
		{"containerd", path.Dir(path.Dir(nodeconfig.ContainerdBinary))},
		{"cni_plugins", nodeconfig.CNIBinDir},
	}
	for _, a := range archives {
		p, ok := src[a.role]
		if !ok {
			continue
		}
		if err := l.mkdir(a.dest); err != nil {
			return "", "", fmt.Errorf("%s: %w", a.role, err)
		}
		if err := unpackFile(ctx, p, l.local(a.dest), unpack.Options{Log: b.log, IgnoreOwner: true}); err != nil {
			return "", "", fmt.Errorf("%s: %w", a.role, err)
		}
	}
	if err := l.mkdir(path.Dir("/" + stampPath)); err != nil {
		return "", "", err
	}
	if err := atomicfile.WriteFile(l.local("/"+stampPath), append(data, '\n'), 0o644); err != nil {
		return "", "", err
	}
	if err := syncfs(partial); err != nil {
		return "", "", err
	}
	if err := atomicfile.Rename(partial, final); err != nil {
		return "", "", err
	}
	b.log.Info("artifact layer built", "path", final)
	return key, final, nil
}

// layer is an artifact layer under construction over a tree.
type layer struct{ tree, dir string }

func (l *layer) local(nodePath string) string {
	return filepath.Join(l.dir, filepath.FromSlash(strings.TrimPrefix(nodePath, "/")))
}

// mkdir makes the node directory p (and its parents) in the layer, each
// with the tree's owner, mode and times when the tree has it. A link or a
// file in the tree where the layer needs a directory is refused: the layer's
// directory would hide it.
func (l *layer) mkdir(p string) error {
	cur := ""
	for _, c := range append([]string{""}, strings.Split(strings.Trim(p, "/"), "/")...) {
		if c == "" && cur != "" {
			continue
		}
		cur = path.Join(cur, c)
		dst := l.local(cur)
		if fi, err := os.Lstat(dst); err == nil && fi.IsDir() {
			continue
		}
		var st unix.Stat_t
		err := unix.Lstat(filepath.Join(l.tree, filepath.FromSlash(cur)), &st)
		switch {
		case errors.Is(err, unix.ENOENT):
			if err := os.Mkdir(dst, 0o755); err != nil {
				return err
			}
			continue
		case err != nil:
			return err
		case st.Mode&unix.S_IFMT != unix.S_IFDIR:
			return fmt.Errorf("/%s in the rootfs is not a directory (mode %#o): refusing to install through it", cur, st.Mode)
		}
		if err := os.Mkdir(dst, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if err := setMeta(dst, &st, false); err != nil {
			return fmt.Errorf("/%s: %w", cur, err)
		}
	}
	return nil
}

// install puts the verified cache file src at the node path dst (0755): a
// hard link, else a copy.
func (l *layer) install(src, dst string) error {
	if err := l.mkdir(path.Dir(dst)); err != nil {
		return err
	}
	local := l.local(dst)
	if err := os.Link(src, local); err != nil {
		root, rerr := os.OpenRoot(l.dir)
		if rerr != nil {
			return rerr
		}
		defer root.Close()
		return copyInto(root, src, dst)
	}
	// Shared with the cache entry, whose content (the verified part) it
	// does not change.
	return os.Chmod(local, 0o755)
}

// pruneArtifactLayers removes the artifact layers under treeDir that no
// slot names, but keep; a failure only costs disk.
func (b *Backend) pruneArtifactLayers(treeDir, keep string, inUse map[string]bool) {
	if inUse == nil {
		return
	}
	dir := filepath.Join(treeDir, artsDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if e.Name() == keep || inUse[e.Name()] {
			continue
		}
		if err := removeTree(filepath.Join(dir, e.Name())); err != nil {
			b.log.Warn("could not prune an artifact layer", "path", filepath.Join(dir, e.Name()), "err", err)
		}
	}
}
