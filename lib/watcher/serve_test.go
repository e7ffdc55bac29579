package watcher

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

// TestFollower: the watcher follows the path its unit runs, through the
// current link and the host root, and only when started through it.
func TestFollower(t *testing.T) {
	prefix := t.TempDir()
	root := testkit.RootAt(t, prefix)
	base := filepath.Join(prefix, root.HostPath())
	// The base is a link to a data directory, so that it can be moved.
	data := filepath.Join(prefix, "data-1")
	release := func(data, rel string) string {
		dir := filepath.Join(data, "releases", rel)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, Stage)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	link := func(target, at string) {
		t.Helper()
		if err := os.Symlink(target, at+".new"); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(at+".new", at); err != nil {
			t.Fatal(err)
		}
	}
	blue, green := release(data, "blue"), release(data, "green")
	if err := os.MkdirAll(filepath.Dir(base), 0o755); err != nil {
		t.Fatal(err)
	}
	link(data, base)
	link("releases/blue", filepath.Join(data, hostroot.CurrentLink))

	args := os.Args
	t.Cleanup(func() { os.Args = args })
	unitPath := filepath.Join(base, hostroot.CurrentLink, Stage)
	for _, c := range []struct {
		argv0  string
		follow bool
	}{
		{unitPath, true},             // as the unit starts it
		{blue, false},                // the release's path itself
		{"./" + Stage, false},        // by hand
		{unitPath + "-other", false}, // another name
	} {
		os.Args = []string{c.argv0}
		if f := newFollower(root); (f.argv0 != "") != c.follow {
			t.Errorf("argv[0] %s: follows = %v, want %v", c.argv0, f.argv0 != "", c.follow)
		}
	}

	os.Args = []string{unitPath}
	f := newFollower(root)
	f.self = blue // as if this process ran blue's binary
	if got := f.changed(); got != "" {
		t.Errorf("nothing moved: changed() = %q", got)
	}
	if !f.concerns(filepath.Join(base, hostroot.CurrentLink)) || !f.concerns(base) || f.concerns(filepath.Join(base, "state")) {
		t.Error("concerns: want the current link and the base, nothing else")
	}
	if d := f.dirs(); len(d) != 1 || d[0] != filepath.Dir(base) {
		t.Errorf("dirs() = %v, want the base's parent", d)
	}
	// An upgrade flips current.
	link("releases/green", filepath.Join(data, hostroot.CurrentLink))
	if got, want := f.changed(), resolved(t, green); got != want {
		t.Errorf("after the flip: changed() = %q, want %s", got, want)
	}
	// The host root moves: the base now leads to another data directory.
	data2 := filepath.Join(prefix, "data-2")
	moved := release(data2, "blue")
	link("releases/blue", filepath.Join(data2, hostroot.CurrentLink))
	link(data2, base)
	if got, want := f.changed(), resolved(t, moved); got != want {
		t.Errorf("after the move: changed() = %q, want %s", got, want)
	}
	// Nothing there any more: nothing to run instead.
	os.Remove(base)
	if got := f.changed(); got != "" {
		t.Errorf("base gone: changed() = %q, want none", got)
	}
	// Not following: never.
	os.Args = []string{blue}
	if got := newFollower(root).changed(); got != "" {
		t.Errorf("not following: changed() = %q", got)
	}
}

func resolved(t *testing.T, p string) string {
	t.Helper()
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestIdentityOf(t *testing.T) {
	dir := t.TempDir()
	pair := filepath.Join(dir, "pair.pem")
	if err := os.WriteFile(pair, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := &rest.Config{Host: "https://a:6443", TLSClientConfig: rest.TLSClientConfig{CAData: []byte("ca"), CertData: []byte("c"), KeyData: []byte("k")}}
	files := &rest.Config{Host: "https://a:6443", TLSClientConfig: rest.TLSClientConfig{CertFile: pair, KeyFile: pair}}
	id, fid := identityOf(base), identityOf(files)
	if identityOf(base) != id || identityOf(files) != fid {
		t.Fatal("identityOf is not stable")
	}
	for name, c := range map[string]*rest.Config{
		"server": {Host: "https://b:6443", TLSClientConfig: base.TLSClientConfig},
		"cert":   {Host: base.Host, TLSClientConfig: rest.TLSClientConfig{CAData: []byte("ca"), CertData: []byte("c2"), KeyData: []byte("k")}},
		"key":    {Host: base.Host, TLSClientConfig: rest.TLSClientConfig{CAData: []byte("ca"), CertData: []byte("c"), KeyData: []byte("k2")}},
		"ca":     {Host: base.Host, TLSClientConfig: rest.TLSClientConfig{CAData: []byte("ca2"), CertData: []byte("c"), KeyData: []byte("k")}},
		// a field boundary moved: "c"+"k" against "ck"+""
		"split": {Host: base.Host, TLSClientConfig: rest.TLSClientConfig{CAData: []byte("ca"), CertData: []byte("ck")}},
	} {
		if identityOf(c) == id {
			t.Errorf("%s changed, identity the same", name)
		}
	}
	// The same file names with new contents: a rotation in place.
	if err := os.WriteFile(pair, []byte("two"), 0o600); err != nil {
		t.Fatal(err)
	}
	if identityOf(files) == fid {
		t.Error("rewritten pair file, identity the same")
	}
}

// A stop signal that came with the flip of current wins: the watcher exits
// instead of re-executing, since the signal would not survive the exec.
func TestNoReexecWhenStopping(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// Were it executed, the binary would replace the test process.
	bin := filepath.Join(t.TempDir(), "kubeslot-watcher")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := reexec(ctx, log, bin); err != nil {
		t.Fatal(err)
	}
	if out := buf.String(); !strings.Contains(out, "not re-executing") || strings.Contains(out, "; re-executing") {
		t.Errorf("log: %s", out)
	}
}
