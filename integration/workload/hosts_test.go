package workload

import (
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
)

func TestHostsTOML(t *testing.T) {
	s := HostsTOML("registry.kubeslot.test", "http://127.0.0.1:32000/")
	var c struct {
		Server string `toml:"server"`
		Host   map[string]struct {
			Capabilities []string `toml:"capabilities"`
		} `toml:"host"`
	}
	if err := toml.Unmarshal([]byte(s), &c); err != nil {
		t.Fatalf("%v\n%s", err, s)
	}
	h, ok := c.Host["http://127.0.0.1:32000"]
	if c.Server != "https://registry.kubeslot.test" || len(c.Host) != 1 || !ok ||
		strings.Join(h.Capabilities, ",") != "pull,resolve" {
		t.Fatalf("parsed %+v from\n%s", c, s)
	}
	if p := HostsTOMLPath("/etc/containerd/certs.d", "registry.kubeslot.test:5000"); p != "/etc/containerd/certs.d/registry.kubeslot.test:5000/hosts.toml" {
		t.Fatalf("path %q", p)
	}
}
