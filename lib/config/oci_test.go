package config

import (
	"strings"
	"testing"
)

func TestOCIRootFSSource(t *testing.T) {
	const sha = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, src := range []string{
		"oci://127.0.0.1:5000/x",
		"oci://registry.example:5000/node/bookworm",
		"oci://registry.example/node/bookworm:1.37.2",
		"oci://localhost/node",
		"oci://registry.example/node/bookworm@sha256:" + sha,
		"oci://registry.example/node/bookworm:v1@sha256:" + sha,
	} {
		cfg, err := Parse("test.toml", []byte(with(minimal, "rootfs", `source = "`+src+`"`)))
		if err != nil {
			t.Errorf("%s: %v", src, err)
			continue
		}
		if cfg.RootFS.Source != src {
			t.Errorf("source changed: %q", cfg.RootFS.Source)
		}
	}

	runErrorCases(t, []errorCase{
		{"credentials", with(minimal, "rootfs", `source = "oci://user:s3cr3t@registry.example/node"`),
			[]want{{"rootfs.source", `"oci://[redacted]@registry.example/node"`, "must not contain credentials", `source =`}}},
		{"no registry", with(minimal, "rootfs", `source = "oci://debian"`),
			[]want{{"rootfs.source", `"oci://debian"`, "must name its registry host", `source =`}}},
		{"no registry, repository path", with(minimal, "rootfs", `source = "oci://library/debian"`),
			[]want{{"rootfs.source", `"oci://library/debian"`, "must name its registry host", `source =`}}},
		{"empty", with(minimal, "rootfs", `source = "oci://"`),
			[]want{{"rootfs.source", `"oci://"`, "must name its registry host", `source =`}}},
		{"bad repository", with(minimal, "rootfs", `source = "oci://registry.example/Node/UPPER"`),
			[]want{{"rootfs.source", `"oci://registry.example/Node/UPPER"`, "is not an image reference", `source =`}}},
		{"bad tag", with(minimal, "rootfs", `source = "oci://registry.example/node:bad tag"`),
			[]want{{"rootfs.source", `"oci://registry.example/node:bad tag"`, "is not an image reference", `source =`}}},
		{"digest disagrees", with(minimal, "rootfs", `source = "oci://registry.example/node@sha256:`+strings.Repeat("ab", 32)+`"`),
			[]want{{"rootfs.source", quote("oci://registry.example/node@sha256:" + strings.Repeat("ab", 32)), "must agree", `source =`}}},
		{"query", with(minimal, "rootfs", `source = "oci://registry.example/node?x=1"`),
			[]want{{"rootfs.source", `"oci://registry.example/node?[redacted]"`, "is not an image reference", `source =`}}},
		{"other scheme names oci", with(minimal, "rootfs", `source = "docker://registry.example/node"`),
			[]want{{"rootfs.source", `"docker://registry.example/node"`, `or an OCI image "oci://`, `source =`}}},
		// A bad sha256 is reported once, on its own key.
		{"oci with bad sha256", with(with(minimal, "rootfs", `source = "oci://registry.example/node"`), "rootfs", `sha256 = "abc"`),
			[]want{{"rootfs.sha256", `"abc"`, "64 hex digits", `sha256 = "abc"`}}},
	})

	// Artifacts stay http(s) or paths: an image is only a rootfs source.
	_, err := Parse("test.toml", []byte(with(minimal, "artifacts.kubelet", `url = "oci://registry.example/kubelet"`)))
	if err == nil || !strings.Contains(err.Error(), "artifacts.kubelet.url") {
		t.Errorf("oci artifact url: %v", err)
	}
}
