package artifact

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// cacheLayout makes, under the cache of f, what a host's cache holds for two
// digests: kept (in use) and old (no longer), in all three directories, plus
// what killed writers leave: a download's and an image's temporary file, a
// sidecar's, and a tree's staging directory. It returns the cache's local
// path.
func cacheLayout(t *testing.T, f *Fetcher, kept, old string) string {
	t.Helper()
	cache, err := f.Root.Path(hostroot.CacheDir)
	if err != nil {
		t.Fatal(err)
	}
	files := []string{
		"sha256/" + kept, "sha256/" + old, "sha256/." + old + ".tmp-123",
		"oci/" + kept + "-linux-amd64.tar", "oci/" + kept + "-linux-amd64.tar.sha256",
		"oci/" + old + "-linux-amd64.image.tar", "oci/" + old + "-linux-amd64.image.tar.sha256",
		"oci/." + kept + "-linux-amd64.image.tar.tmp-99", "oci/." + kept + "-linux-amd64.tar.sha256.tmp-7",
		"trees/" + kept + "/rootfs/etc/os-release", "trees/" + kept + "/complete.json",
		"trees/" + old + "/rootfs/bin/sh", "trees/" + old + "/complete.json",
		"trees/." + kept + ".partial/rootfs/usr/bin/env",
	}
	for _, p := range files {
		p = filepath.Join(cache, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A read-only directory inside a tree, as a rootfs has.
	if err := os.Chmod(filepath.Join(cache, "trees", old, "rootfs", "bin"), 0o555); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(filepath.Join(cache, "trees", old, "rootfs", "bin"), 0o755) })
	return cache
}

// listCache lists every entry of the cache's three directories as "dir/name".
func listCache(t *testing.T, cache string) []string {
	t.Helper()
	var out []string
	for _, sub := range []string{CacheSubdir, OCISubdir, TreesSubdir} {
		es, err := os.ReadDir(filepath.Join(cache, sub))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			out = append(out, sub+"/"+e.Name())
		}
	}
	slices.Sort(out)
	return out
}

func TestRemoveStaleRemovesOnlyWhatKilledWritersLeft(t *testing.T) {
	f, logs := newFetcher(t)
	kept, old := strings.Repeat("a", 64), strings.Repeat("b", 64)
	cache := cacheLayout(t, f, kept, old)
	if err := RemoveStale(f.Root, f.Log); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"oci/" + kept + "-linux-amd64.tar", "oci/" + kept + "-linux-amd64.tar.sha256",
		"oci/" + old + "-linux-amd64.image.tar", "oci/" + old + "-linux-amd64.image.tar.sha256",
		"sha256/" + kept, "sha256/" + old,
		"trees/" + kept, "trees/" + old,
	}
	slices.Sort(want)
	if got := listCache(t, cache); !slices.Equal(got, want) {
		t.Errorf("after RemoveStale:\n got %v\nwant %v", got, want)
	}
	if !strings.Contains(logs.String(), ".partial") {
		t.Errorf("the removed staging tree is not logged:\n%s", logs)
	}
	// Nothing left to remove; a missing cache is fine too.
	if err := RemoveStale(f.Root, f.Log); err != nil {
		t.Error(err)
	}
	empty, _ := newFetcher(t)
	if err := RemoveStale(empty.Root, nil); err != nil {
		t.Errorf("missing cache: %v", err)
	}
}

func TestPruneKeepsOnlyWhatIsNamed(t *testing.T) {
	f, _ := newFetcher(t)
	kept, old := strings.Repeat("a", 64), strings.Repeat("b", 64)
	cache := cacheLayout(t, f, kept, old)
	before := listCache(t, cache)
	if err := f.Prune([]string{kept, "not a digest"}); err == nil {
		t.Fatal("a keep list with a bad digest was accepted")
	}
	if got := listCache(t, cache); !slices.Equal(got, before) {
		t.Fatalf("a refused prune removed something: %v", got)
	}
	if err := f.Prune([]string{strings.ToUpper(kept)}); err != nil {
		t.Fatal(err)
	}
	want := []string{"oci/" + kept + "-linux-amd64.tar", "oci/" + kept + "-linux-amd64.tar.sha256", "sha256/" + kept, "trees/" + kept}
	if got := listCache(t, cache); !slices.Equal(got, want) {
		t.Errorf("after Prune:\n got %v\nwant %v", got, want)
	}
	// The kept tree is whole.
	if _, err := os.Stat(filepath.Join(cache, "trees", kept, "rootfs", "etc", "os-release")); err != nil {
		t.Error(err)
	}
	if err := f.Prune(nil); err != nil {
		t.Fatal(err)
	}
	if got := listCache(t, cache); len(got) != 0 {
		t.Errorf("keep nothing left %v", got)
	}
}
