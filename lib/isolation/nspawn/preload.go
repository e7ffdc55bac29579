package nspawn

import (
	"context"
	"fmt"
	"path"
	"path/filepath"
	"strings"

	"github.com/kubeslot/kubeslot/lib/artifact"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
	"github.com/kubeslot/kubeslot/lib/oci"
	"github.com/kubeslot/kubeslot/lib/oci/ociref"
)

// ensurePreloads fetches and verifies [node] preload_images into the
// artifact cache (an archive by its sha256, an oci:// image by its manifest
// digest, written as an archive) and returns their paths inside the node,
// where the cache is bound read-only. A bad checksum or an unreachable
// source fails configure, before the old node stops.
func (b *Backend) ensurePreloads(ctx context.Context) ([]string, error) {
	images := b.cfg.Node.PreloadImages
	if len(images) == 0 {
		return nil, nil
	}
	cache, err := b.root.Path(hostroot.CacheDir)
	if err != nil {
		return nil, err
	}
	timeout := b.cfg.Timeouts.Download.Duration
	files := &artifact.Fetcher{Root: b.root, Log: b.log, Timeout: timeout}
	archives := &oci.Fetcher{Root: b.root, Log: b.log, Timeout: timeout}
	var out []string
	for i, im := range images {
		ensure := files.Ensure
		if ociref.Is(im.Source) {
			ensure = archives.EnsureArchive
		}
		p, err := ensure(ctx, im.Source, im.SHA256)
		if err != nil {
			return nil, fmt.Errorf("node.preload_images[%d]: %w", i, err)
		}
		rel, err := filepath.Rel(cache, p)
		if err != nil || strings.HasPrefix(rel, "..") {
			return nil, fmt.Errorf("node.preload_images[%d]: %s is not in the cache %s", i, p, cache)
		}
		out = append(out, path.Join(nodeconfig.CacheMount, filepath.ToSlash(rel)))
	}
	return out, nil
}
