package nspawn

import (
	"strings"
	"testing"
)

// A running slot's kubelet is replaced in place: the binary and the stamp
// name the new one, nothing else of the slot changes, a second patch does
// nothing more, and a provision for the same configuration then finds the
// slot built. The old configuration patches the old kubelet back. A change
// of anything but the kubelet is refused, the slot untouched.
func TestPatchKubelet(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	if err := e.backend(nil).Provision(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	e.put("/var/lib/machines/a/var/tmp/pod-state", []byte("x"))
	e.sd.Units[unitName("a")] = "active" // a running node: no rebuild allowed
	kubelet2 := []byte("#!/bin/sh\necho kubelet v2\n")
	e.put("/srv/kubelet2", kubelet2)
	cfg2 := e.config(func(s string) string {
		s = strings.Replace(s, `version = "1.37.2"`, `version = "1.37.3"`, 1)
		s = strings.Replace(s, `url = "/srv/kubelet"`, `url = "/srv/kubelet2"`, 1)
		return strings.Replace(s, digest(e.kubelet), digest(kubelet2), 1)
	})
	b2 := e.backend(cfg2)
	for range 2 {
		if err := b2.PatchKubelet(ctx, "a"); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.read("/var/lib/machines/a/usr/local/bin/kubelet"); got != string(kubelet2) {
		t.Errorf("kubelet after the patch: %q", got)
	}
	if !e.exists("/var/lib/machines/a/var/tmp/pod-state") {
		t.Error("the patch rebuilt the slot")
	}
	if !strings.Contains(e.read("/var/lib/machines/a/"+stampPath), digest(kubelet2)) {
		t.Errorf("stamp after the patch:\n%s", e.read("/var/lib/machines/a/"+stampPath))
	}
	if built, err := b2.Provisioned("a"); err != nil || !built {
		t.Errorf("after the patch the slot reads as built from its configuration: %v, %v", built, err)
	}
	// And back.
	if err := e.backend(nil).PatchKubelet(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if got := e.read("/var/lib/machines/a/usr/local/bin/kubelet"); got != string(e.kubelet) {
		t.Errorf("kubelet after patching back: %q", got)
	}
	// Another rootfs is no patch.
	e.put("/srv/rootfs2.tar", tarball(t, map[string]string{"etc/os-release": "ID=debian\n"}))
	cfg3 := e.config(func(s string) string {
		s = strings.Replace(s, `source = "/srv/rootfs.tar"`, `source = "/srv/rootfs2.tar"`, 1)
		return strings.Replace(s, digest(e.rootfs), strings.Repeat("0", 64), 1)
	})
	if err := e.backend(cfg3).PatchKubelet(ctx, "a"); err == nil || !strings.Contains(err.Error(), "only a repave") {
		t.Errorf("patch with another rootfs: %v, want a refusal", err)
	}
	if got := e.read("/var/lib/machines/a/usr/local/bin/kubelet"); got != string(e.kubelet) {
		t.Errorf("kubelet after the refused patch: %q", got)
	}
}
