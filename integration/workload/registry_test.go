package workload

import (
	"archive/tar"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func layerFiles(t *testing.T, l v1.Layer) map[string]*tar.Header {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	files := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = h
	}
}

func TestImagesPushPullAndCount(t *testing.T) {
	app := Build(t)
	t0 := time.Now()
	img, pause := app.Image(t), app.PauseImage(t)
	reg := NewRegistry(t)
	ref, dig := reg.Push(t, "workload", "v1", img)
	pref, pdig := reg.Push(t, "workload", "pause", pause)
	t.Logf("images made and pushed in %s", time.Since(t0).Round(time.Millisecond))
	if ref != reg.Host+"/workload:v1" || pref != reg.Host+"/workload:pause" {
		t.Fatalf("refs %q %q", ref, pref)
	}
	if n := len(reg.Requests()); n != 0 {
		t.Fatalf("pushes counted: %v", reg.Requests())
	}

	pulled := func(ref string) v1.Image {
		t.Helper()
		r, err := name.ParseReference(ref, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		img, err := remote.Image(r)
		if err != nil {
			t.Fatal(err)
		}
		return img
	}
	got := pulled(ref)
	if d, err := got.Digest(); err != nil || d.String() != dig {
		t.Fatalf("pulled digest %v (%v), pushed %s", d, err, dig)
	}
	cf, err := got.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != app.GOARCH || strings.Join(cf.Config.Entrypoint, " ") != "/app" {
		t.Fatalf("config: %s/%s entrypoint %q", cf.OS, cf.Architecture, cf.Config.Entrypoint)
	}
	ls, err := got.Layers()
	if err != nil || len(ls) != 1 {
		t.Fatalf("layers: %d, %v", len(ls), err)
	}
	files := layerFiles(t, ls[0]) // reads the layer blob: one GET
	if h := files["app"]; h == nil || h.Mode != 0o755 || h.Typeflag != tar.TypeReg {
		t.Fatalf("layer's app: %+v", h)
	}
	if h := files["pause"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "app" {
		t.Fatalf("layer's pause: %+v", h)
	}
	if g, b := reg.ManifestGETs("workload"), reg.BlobGETs("workload"); g != 1 || b != 2 {
		t.Fatalf("after one pull: %d manifest GETs, %d blob GETs (config+layer), want 1, 2; %v", g, b, reg.Requests())
	}

	// the pause image is the same layer under another config
	p := pulled(pref)
	if d, _ := p.Digest(); d.String() != pdig || pdig == dig {
		t.Fatalf("pause digest %v, pushed %s, workload %s", d, pdig, dig)
	}
	pcf, err := p.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	pls, err := p.Layers()
	if err != nil || len(pls) != 1 {
		t.Fatalf("pause layers: %d, %v", len(pls), err)
	}
	ld, _ := ls[0].Digest()
	pld, _ := pls[0].Digest()
	if ld != pld || strings.Join(pcf.Config.Entrypoint, " ") != "/pause" {
		t.Fatalf("pause layer %v (workload's %v), entrypoint %q", pld, ld, pcf.Config.Entrypoint)
	}

	// a mirror request as containerd sends it: by tag, with ?ns=
	reg.Reset()
	req, err := http.NewRequest(http.MethodHead, reg.MirrorURL()+"/v2/workload/manifests/v1?ns=registry.kubeslot.test", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/vnd.docker.distribution.manifest.v2+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Docker-Content-Digest") != dig {
		t.Fatalf("HEAD as a mirror: %d, digest %q, want %s", resp.StatusCode, resp.Header.Get("Docker-Content-Digest"), dig)
	}
	if h, g, b := reg.ManifestHEADs("workload"), reg.ManifestGETs("workload"), reg.BlobGETs("workload"); h != 1 || g != 0 || b != 0 {
		t.Fatalf("after Reset and a HEAD: %d HEADs, %d GETs, %d blob GETs", h, g, b)
	}
	if n := reg.BlobGETs("other"); n != 0 {
		t.Fatalf("another repository counted %d blob GETs", n)
	}
}

func TestArchive(t *testing.T) {
	app := Build(t)
	img, pause := app.Image(t), app.PauseImage(t)
	path := filepath.Join(t.TempDir(), "workload.tar")
	t0 := time.Now()
	sum := WriteArchive(t, path, map[string]v1.Image{
		"registry.kubeslot.test/workload:v1":    img,
		"registry.kubeslot.test/workload:pause": pause,
	})
	t.Logf("archive written in %s", time.Since(t0).Round(time.Millisecond))
	if len(sum) != 64 {
		t.Fatalf("sum %q", sum)
	}
	for tagName, want := range map[string]v1.Image{
		"registry.kubeslot.test/workload:v1":    img,
		"registry.kubeslot.test/workload:pause": pause,
	} {
		tag, err := name.NewTag(tagName)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tarball.ImageFromPath(path, &tag)
		if err != nil {
			t.Fatal(err)
		}
		gc, err := got.ConfigName()
		if err != nil {
			t.Fatal(err)
		}
		wc, _ := want.ConfigName()
		gd, err := got.Digest()
		if err != nil {
			t.Fatal(err)
		}
		wd, _ := want.Digest()
		if gc != wc || gd != wd {
			t.Fatalf("%s from the archive: config %v digest %v, want %v %v", tagName, gc, gd, wc, wd)
		}
	}
	// the shared layer is in the archive once
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	var layers int
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(h.Name, ".tar.gz") {
			layers++
		}
	}
	if layers != 1 {
		t.Fatalf("%d layer files in the archive, want 1", layers)
	}
}
