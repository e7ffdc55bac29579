package bundle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// release unpacks a fresh bundle and returns the release directory.
func release(t *testing.T) string {
	t.Helper()
	p, s, _ := create(t)
	dest := filepath.Join(t.TempDir(), "blue")
	if _, err := Unpack(context.Background(), p, s, "amd64", dest, Limits{}); err != nil {
		t.Fatal(err)
	}
	return dest
}

func TestVerifyDirRefuses(t *testing.T) {
	for name, c := range map[string]struct {
		edit     func(t *testing.T, dir string)
		wantArch string
		want     string
	}{
		"content changed": {edit: func(t *testing.T, dir string) {
			p := filepath.Join(dir, "kubeslot-watcher")
			b, _ := os.ReadFile(p)
			b[0] ^= 1
			os.WriteFile(p, b, 0o755)
		}, want: "file kubeslot-watcher: sha256 "},
		"size changed": {edit: func(t *testing.T, dir string) {
			f, _ := os.OpenFile(filepath.Join(dir, "units", "kubeslot-repave.path"), os.O_APPEND|os.O_WRONLY, 0)
			f.WriteString("\n")
			f.Close()
		}, want: fmt.Sprintf("file units/kubeslot-repave.path: size %d, manifest says %d", len(unitBodies["kubeslot-repave.path"])+1, len(unitBodies["kubeslot-repave.path"]))},
		"mode changed": {edit: func(t *testing.T, dir string) {
			os.Chmod(filepath.Join(dir, "kubeslot"), 0o775)
		}, want: "file kubeslot: mode -rwxrwxr-x, manifest says -rwxr-xr-x"},
		"setuid": {edit: func(t *testing.T, dir string) {
			os.Chmod(filepath.Join(dir, "kubeslot"), 0o755|fs.ModeSetuid)
		}, want: "file kubeslot: mode urwxr-xr-x"},
		"unlisted file": {edit: func(t *testing.T, dir string) {
			write(t, filepath.Join(dir, "kubeslot-extra"), "x", 0o755)
		}, want: "file kubeslot-extra is not in the manifest"},
		"unlisted unit": {edit: func(t *testing.T, dir string) {
			write(t, filepath.Join(dir, "units", "extra.service"), "x", 0o644)
		}, want: "file units/extra.service is not in the manifest"},
		"extra directory": {edit: func(t *testing.T, dir string) {
			os.Mkdir(filepath.Join(dir, "units", "sub"), 0o755)
		}, want: "units/sub is not a regular file"},
		"missing file": {edit: func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "units", "kubeslot-watcher.service"))
		}, want: "file units/kubeslot-watcher.service is missing"},
		"file replaced by a link": {edit: func(t *testing.T, dir string) {
			os.Rename(filepath.Join(dir, "kubeslot"), filepath.Join(t.TempDir(), "k"))
			os.Symlink("kubeslot-watcher", filepath.Join(dir, "kubeslot"))
		}, want: "kubeslot is not a regular file"},
		"units is a link": {edit: func(t *testing.T, dir string) {
			other := filepath.Join(t.TempDir(), "units")
			os.Rename(filepath.Join(dir, "units"), other)
			os.Symlink(other, filepath.Join(dir, "units"))
		}, want: "units is not a regular file"},
		"missing binary in manifest": {edit: func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "kubeslot-resetter"))
			editManifest(t, dir, func(m *Manifest) {
				var keep []File
				for _, f := range m.Files {
					if f.Path != "kubeslot-resetter" {
						keep = append(keep, f)
					}
				}
				m.Files = keep
			})
		}, want: "binary kubeslot-resetter is missing"},
		"wrong arch": {wantArch: "riscv64", want: `arch: "amd64", want "riscv64"`},
		"manifest sha differs": {edit: func(t *testing.T, dir string) {
			editManifest(t, dir, func(m *Manifest) { m.Files[0].SHA256 = strings.Repeat("0", 64) })
		}, want: "manifest says 0000"},
		"manifest is a link": {edit: func(t *testing.T, dir string) {
			other := filepath.Join(t.TempDir(), ManifestName)
			os.Rename(filepath.Join(dir, ManifestName), other)
			os.Symlink(other, filepath.Join(dir, ManifestName))
		}, want: "manifest.json is a symbolic link"},
		"no manifest": {edit: func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, ManifestName))
		}, want: "no such file"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := release(t)
			if c.edit != nil {
				c.edit(t, dir)
			}
			_, err := VerifyDir(dir, c.wantArch)
			if err == nil {
				t.Fatal("VerifyDir accepted it")
			}
			t.Logf("error: %v", err)
			if !errors.Is(err, ErrInvalid) {
				t.Error("error does not wrap ErrInvalid")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error does not say %q", c.want)
			}
		})
	}
	if _, err := VerifyDir(release(t), ""); err != nil {
		t.Errorf("an untouched release: %v", err)
	}
	if _, err := ReadManifest(filepath.Join(t.TempDir(), "none")); !errors.Is(err, fs.ErrNotExist) || !errors.Is(err, ErrInvalid) {
		t.Errorf("no manifest: %v; want both fs.ErrNotExist and ErrInvalid", err)
	}
}

func editManifest(t *testing.T, dir string, edit func(*Manifest)) {
	t.Helper()
	m, err := ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	edit(m)
	data, _ := m.encode()
	if err := os.WriteFile(filepath.Join(dir, ManifestName), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestReadManifestRefuses(t *testing.T) {
	good := func() map[string]any {
		return map[string]any{
			"version": "v1.0.0", "arch": "amd64", "created": "2026-01-02T03:04:05Z",
			"files": []any{map[string]any{"path": "kubeslot", "sha256": strings.Repeat("a", 64), "size": 1, "mode": 0o755}},
		}
	}
	file := func(k string, v any) func(m map[string]any) {
		return func(m map[string]any) { m["files"].([]any)[0].(map[string]any)[k] = v }
	}
	for name, c := range map[string]struct {
		edit func(map[string]any)
		raw  string
		want string
	}{
		"unknown top field":  {edit: func(m map[string]any) { m["extra"] = 1 }, want: `unknown field "extra"`},
		"unknown file field": {edit: file("owner", "root"), want: `unknown field "owner"`},
		"version missing":    {edit: func(m map[string]any) { delete(m, "version") }, want: `version ""`},
		"version unsafe":     {edit: func(m map[string]any) { m["version"] = "v1/../x" }, want: `version "v1/../x"`},
		"version spaces":     {edit: func(m map[string]any) { m["version"] = "v1 beta" }, want: `version "v1 beta"`},
		"arch unknown":       {edit: func(m map[string]any) { m["arch"] = "x86_64" }, want: `architecture "x86_64"`},
		"created missing":    {edit: func(m map[string]any) { delete(m, "created") }, want: "created: missing"},
		"path dot-dot":       {edit: file("path", "../kubeslot"), want: `holds ".."`},
		"path units dot-dot": {edit: file("path", "units/../kubeslot"), want: `holds ".."`},
		"path absolute":      {edit: file("path", "/usr/bin/kubeslot"), want: "absolute"},
		"path unclean":       {edit: file("path", "units//a.service"), want: "not clean"},
		"path dot":           {edit: file("path", "./kubeslot"), want: "not clean"},
		"path too deep":      {edit: file("path", "units/a/b.service"), want: "no deeper"},
		"path other dir":     {edit: file("path", "etc/a"), want: "no deeper"},
		"path empty":         {edit: file("path", ""), want: "empty path"},
		"path control":       {edit: file("path", "kube\nslot"), want: "control character"},
		"path manifest":      {edit: file("path", ManifestName), want: "reserved"},
		"sha uppercase":      {edit: file("sha256", strings.Repeat("A", 64)), want: "lowercase hex"},
		"sha short":          {edit: file("sha256", "abc"), want: `sha256 "abc"`},
		"negative size":      {edit: file("size", -1), want: "size -1"},
		"mode setuid":        {edit: file("mode", 0o4755), want: "only permission bits"},
		"duplicate path": {edit: func(m map[string]any) {
			m["files"] = append(m["files"].([]any), m["files"].([]any)[0])
		}, want: "listed twice"},
		"wrong type":    {edit: file("size", "1"), want: "cannot unmarshal"},
		"trailing data": {raw: `{"version":"v1","arch":"amd64","created":"2026-01-02T03:04:05Z","files":[]} {}`, want: "data after"},
		"not json":      {raw: "version = 1", want: "invalid character"},
		"too large":     {raw: `{"version":"v1",` + strings.Repeat(" ", maxManifest) + `}`, want: "over 1048576 bytes"},
	} {
		t.Run(name, func(t *testing.T) {
			data := []byte(c.raw)
			if c.edit != nil {
				m := good()
				c.edit(m)
				data, _ = json.Marshal(m)
			}
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, ManifestName), data, 0o644)
			_, err := ReadManifest(dir)
			if err == nil {
				t.Fatal("accepted")
			}
			t.Logf("error: %v", err)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("want an ErrInvalid saying %q", c.want)
			}
		})
	}
	// The unedited manifest is accepted, so each case fails for its edit.
	dir := t.TempDir()
	data, _ := json.Marshal(good())
	os.WriteFile(filepath.Join(dir, ManifestName), data, 0o644)
	if _, err := ReadManifest(dir); err != nil {
		t.Fatalf("the valid manifest: %v", err)
	}
}
