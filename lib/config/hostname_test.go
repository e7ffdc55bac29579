package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A file without [machine] name is valid and takes the host's name at the
// stage: the first label, lower-cased, node_name the same; a name set in the
// file stays; a host name that gives no label is refused naming the field.
func TestNameFromHost(t *testing.T) {
	doc := strings.Replace(minimal, "name = \"worker-1\"\n", "", 1)
	if doc == minimal {
		t.Fatal("the minimal configuration names no machine to remove")
	}
	c := mustParse(t, doc)
	if c.Machine.Name != "" {
		t.Fatalf("name %q before the host's", c.Machine.Name)
	}
	if err := c.NameFromHost("Edge-17.dc1.example.com"); err != nil || c.Machine.Name != "edge-17" || c.Machine.NodeName != "edge-17" {
		t.Errorf("from an FQDN: %q %q, %v", c.Machine.Name, c.Machine.NodeName, err)
	}
	named := mustParse(t, minimal)
	if err := named.NameFromHost("other"); err != nil || named.Machine.Name != "worker-1" {
		t.Errorf("a name in the file: %q, %v", named.Machine.Name, err)
	}
	for _, bad := range []string{"", "under_score", "-x"} {
		c := mustParse(t, doc)
		if err := c.NameFromHost(bad); err == nil || !strings.Contains(err.Error(), "machine.name") {
			t.Errorf("host name %q: %v", bad, err)
		}
	}
	// An explicit empty name is refused: leave the key out for the host's.
	if _, err := Parse("x.toml", []byte(strings.Replace(minimal, `name = "worker-1"`, `name = ""`, 1))); err == nil ||
		!strings.Contains(err.Error(), "machine.name") || !strings.Contains(err.Error(), "omit the key") {
		t.Errorf("name = \"\": %v", err)
	}
	// A stage reads the file with this host's name.
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	defer func(h func() string) { hostname = h }(hostname)
	hostname = func() string { return "rack3-node9" }
	if c, err := LoadForStage(p); err != nil || c.Machine.Name != "rack3-node9" {
		t.Errorf("LoadForStage: %+v, %v", c, err)
	}
}
