package nspawn

import (
	"archive/tar"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/oci/ocitest"
)

type ociEntry = ocitest.Entry

// ociConfig is e's configuration with the rootfs taken from an image.
func (e *env) ociConfig(source, sha string) *config.Config {
	e.t.Helper()
	return e.config(func(s string) string {
		s = strings.Replace(s, `source = "/srv/rootfs.tar"`, `source = "`+source+`"`, 1)
		return strings.Replace(s, digest(e.rootfs), sha, 1)
	})
}

func nodeImage(t *testing.T) v1.Image {
	lower := ocitest.Layer(t,
		ociEntry{Name: "etc/"}, ociEntry{Name: "etc/os-release", Body: "ID=debian\n"},
		ociEntry{Name: "etc/old.conf", Body: "deleted above\n"},
		ociEntry{Name: "usr/"}, ociEntry{Name: "usr/bin/"}, ociEntry{Name: "usr/bin/true", Body: "#!/bin/sh\n", Mode: 0o755},
		ociEntry{Name: "usr/local/"}, ociEntry{Name: "usr/local/bin/"}, ociEntry{Name: "usr/lib/"},
		ociEntry{Name: "bin", Type: tar.TypeSymlink, Link: "usr/bin"})
	upper := ocitest.Layer(t, ociEntry{Name: "etc/.wh.old.conf"}, ociEntry{Name: "etc/motd", Body: "from the image\n"})
	return ocitest.Image(t, "", lower, upper)
}

func TestProvisionFromOCIImage(t *testing.T) {
	e := newEnv(t)
	reg := ocitest.NewRegistry(t)
	dgst := reg.Push(t, "node/bookworm", "v1", nodeImage(t))
	cfg := e.ociConfig("oci://"+reg.Host+"/node/bookworm:v1", dgst)
	b := e.backend(cfg)
	if err := b.Provision(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if n := len(reg.Requests()); n == 0 {
		t.Fatal("no registry request for the first slot")
	}
	for p, want := range map[string]string{
		"/var/lib/machines/a/etc/os-release":        "ID=debian\n",
		"/var/lib/machines/a/etc/motd":              "from the image\n",
		"/var/lib/machines/a/usr/local/bin/kubelet": string(e.kubelet),
		"/var/lib/machines/a/usr/bin/true":          "#!/bin/sh\n",
	} {
		if got := e.read(p); got != want {
			t.Errorf("%s: %q, want %q", p, got, want)
		}
	}
	if e.exists("/var/lib/machines/a/etc/old.conf") || e.exists("/var/lib/machines/a/etc/.wh.old.conf") {
		t.Error("the whiteout was not applied")
	}
	if l, err := os.Readlink(filepath.Join(e.root.Prefix(), "/var/lib/machines/a/bin")); err != nil || l != "usr/bin" {
		t.Errorf("bin: %q %v", l, err)
	}
	var st Stamp
	if err := json.Unmarshal([]byte(e.read("/var/lib/machines/a/"+stampPath)), &st); err != nil || st.RootFS != dgst {
		t.Errorf("stamp %+v %v, want rootfs %s", st, err, dgst)
	}
	if ok, err := b.Provisioned("a"); err != nil || !ok {
		t.Errorf("Provisioned(a): %v %v", ok, err)
	}
	e.checkJournalledBeforeCreated()
	if p := "/opt/kubeslot/cache/oci/" + dgst + "-linux-" + goarch() + ".tar"; !e.exists(p) || !e.exists(p+".sha256") {
		t.Errorf("%s (and its .sha256) not cached", p)
	}

	// The second slot comes from the cache: not one request.
	if err := b.Provision(t.Context(), "b"); err != nil {
		t.Fatal(err)
	}
	if r := reg.Requests(); len(r) != 0 {
		t.Errorf("second slot made registry requests: %q", r)
	}
	if e.read("/var/lib/machines/b/etc/motd") != "from the image\n" {
		t.Error("slot b differs")
	}
}

func TestProvisionOCIWrongDigestChangesNothing(t *testing.T) {
	e := newEnv(t)
	reg := ocitest.NewRegistry(t)
	reg.Push(t, "node/bookworm", "v1", nodeImage(t))
	err := e.backend(e.ociConfig("oci://"+reg.Host+"/node/bookworm:v1", strings.Repeat("ab", 32))).Provision(t.Context(), "a")
	if err == nil || !strings.Contains(err.Error(), "rootfs") || !strings.Contains(err.Error(), reg.Host+"/node/bookworm@sha256:"+strings.Repeat("ab", 32)) {
		t.Fatalf("want a rootfs error naming the pinned image, got %v", err)
	}
	t.Log(err)
	for _, p := range []string{"/var/lib/machines", "/opt/kubeslot/cache/oci/" + strings.Repeat("ab", 32) + "-linux-" + goarch() + ".tar"} {
		if e.exists(p) {
			t.Errorf("%s created despite the refused image", p)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(e.root.Prefix(), "/opt/kubeslot/cache/oci")); len(ents) != 0 {
		t.Errorf("cache/oci holds %d entries", len(ents))
	}
	if len(e.rec.Journal) != 0 {
		t.Errorf("journal: %+v", e.rec.Journal)
	}
}

func TestProvisionOCIEscapingLayerRefused(t *testing.T) {
	e := newEnv(t)
	reg := ocitest.NewRegistry(t)
	bad := ocitest.Layer(t, ociEntry{Name: "etc/"}, ociEntry{Name: "../escape", Body: "x"}, ociEntry{Name: "../../escape", Body: "x"})
	dgst := reg.Push(t, "node/bad", "v1", ocitest.Image(t, "", ocitest.Layer(t, ociEntry{Name: "etc/os-release", Body: "ID=x\n"}), bad))
	err := e.backend(e.ociConfig("oci://"+reg.Host+"/node/bad", dgst)).Provision(t.Context(), "a")
	if err == nil || !strings.Contains(err.Error(), "unsafe tar path") {
		t.Fatalf("want the escaping entry refused, got %v", err)
	}
	t.Log(err)
	for _, p := range []string{"/escape", "/var/lib/escape", "/var/lib/machines", "/opt/kubeslot/cache/escape", "/opt/kubeslot/escape"} {
		if e.exists(p) {
			t.Errorf("%s exists", p)
		}
	}
	if _, err := os.Lstat(filepath.Join(filepath.Dir(e.root.Prefix()), "escape")); err == nil {
		t.Error("written above the host root")
	}
	if ents, _ := os.ReadDir(filepath.Join(e.root.Prefix(), "/opt/kubeslot/cache/oci")); len(ents) != 0 {
		t.Errorf("cache/oci holds %d entries", len(ents))
	}
}

func goarch() string { return runtime.GOARCH }
