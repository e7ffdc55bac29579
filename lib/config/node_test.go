package config

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestNodeSection: [node] is optional and leaves the fingerprint of a
// configuration without it alone; its values are validated with the key,
// the line and the value named.
func TestNodeSection(t *testing.T) {
	base := mustParse(t, minimal)
	if base.Node.CNI.CNIMode() != CNICluster || base.Node.Sandbox() != DefaultSandboxImage {
		t.Errorf("defaults: cni %q, sandbox %q", base.Node.CNI.CNIMode(), base.Node.Sandbox())
	}
	doc := with(minimal, "node.cni", `mode = "bridge"`)
	doc = with(doc, "node", `sandbox_image = "mirror.example:5000/pause:3.10"`)
	doc = with(doc, "node.registry_mirrors", `"registry.k8s.io" = ["http://127.0.0.1:5000", "https://mirror.example"]`)
	doc = with(doc, "node.kube_reserved", `memory = "256Mi"`)
	doc = with(doc, "node.system_reserved", `cpu = "100m"`)
	doc = with(doc, "node", `preload_images = [{source = "/srv/images/web.tar", sha256 = "`+strings.Repeat("b", 64)+`"}, {source = "oci://registry.example/apps/web:v1", sha256 = "`+strings.Repeat("c", 64)+`"}]`)
	cfg := mustParse(t, doc)
	if cfg.Node.CNI.CNIMode() != CNIBridge || cfg.Node.Sandbox() != "mirror.example:5000/pause:3.10" ||
		len(cfg.Node.RegistryMirrors["registry.k8s.io"]) != 2 || cfg.Node.KubeReserved["memory"] != "256Mi" ||
		len(cfg.Node.PreloadImages) != 2 || cfg.Node.PreloadImages[1].Source != "oci://registry.example/apps/web:v1" {
		t.Errorf("parsed %+v", cfg.Node)
	}
	if cfg.Fingerprint() == base.Fingerprint() {
		t.Error("the node section does not change the fingerprint")
	}
	if b, err := json.Marshal(base); err != nil || strings.Contains(string(b), `"node"`) {
		t.Error("a configuration without [node] writes a node key: its fingerprint would change")
	}

	for _, c := range []struct{ table, line, want string }{
		{"node.cni", `mode = "calico"`, `node.cni.mode`},
		{"node", `sandbox_image = "pause"`, `node.sandbox_image`},
		{"node.registry_mirrors", `"docker.io" = ["ftp://mirror"]`, `node.registry_mirrors."docker.io"[0]`},
		{"node.registry_mirrors", `"docker.io" = ["https://u:p@mirror"]`, `node.registry_mirrors."docker.io"[0]`},
		{"node.registry_mirrors", `"bad host/x" = ["https://mirror"]`, `node.registry_mirrors."bad host/x"`},
		{"node.registry_mirrors", `"docker.io" = []`, `node.registry_mirrors."docker.io"`},
		{"node.kube_reserved", `gpu = "1"`, `node.kube_reserved.gpu`},
		{"node.system_reserved", `memory = "lots"`, `node.system_reserved.memory`},
		{"node", `preload_images = [{source = "oci://registry.example/apps/web", sha256 = "` + strings.Repeat("a", 64) + `"}]`, `node.preload_images[0].source`},
		{"node", `preload_images = [{source = "images/web.tar", sha256 = "` + strings.Repeat("a", 64) + `"}]`, `node.preload_images[0].source`},
		{"node", `preload_images = [{source = "/srv/web.tar", sha256 = "abc"}]`, `node.preload_images[0].sha256`},
	} {
		errs := parseErrors(t, with(minimal, c.table, c.line))
		if len(errs) != 1 || !strings.Contains(errs.Error(), c.want) || !strings.Contains(errs.Error(), "test.toml:") {
			t.Errorf("%s: errors %v, want one naming %s with its line", c.line, errs, c.want)
		}
		if strings.Contains(errs.Error(), "u:p@") {
			t.Errorf("%s: the error echoes the credentials: %v", c.line, errs)
		}
	}
}
