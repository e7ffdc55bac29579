package config

import (
	"strings"
	"testing"
)

func TestMetricsListen(t *testing.T) {
	for _, ok := range []string{`listen = "127.0.0.1:9469"`, `listen = "[::1]:9469"`, `listen = "localhost:1"`,
		"listen = \"0.0.0.0:9469\"\nallow_remote = true"} {
		doc := minimal + "\n[metrics]\n" + ok + "\n"
		if c := mustParse(t, doc); c.Metrics.Listen == "" {
			t.Errorf("%s: listen not read", ok)
		}
	}
	for line, want := range map[string]string{
		`listen = "9469"`:           "want host:port",
		`listen = "127.0.0.1:0"`:    "from 1 to 65535",
		`listen = "127.0.0.1:http"`: "from 1 to 65535",
		`listen = ":9469"`:          "want an IP address or localhost",
		`listen = "0.0.0.0:9469"`:   "metrics.allow_remote = true",
		`listen = "10.1.2.3:9469"`:  "not a loopback address",
	} {
		errs := parseErrors(t, minimal+"\n[metrics]\n"+line+"\n")
		if len(errs) != 1 {
			t.Errorf("%s: %d errors, want 1: %v", line, len(errs), errs)
			continue
		}
		e := errs[0]
		_, val, _ := strings.Cut(line, " = ")
		if e.Key != "metrics.listen" || e.File != "test.toml" || e.Value != val || e.Line == 0 || !strings.Contains(e.Msg, want) {
			t.Errorf("%s: %q (key %q, value %q, line %d), want metrics.listen, the value, its line and %q", line, e.Error(), e.Key, e.Value, e.Line, want)
		}
	}
}

// TestMetricsNotFingerprinted: turning metrics on is not a new node
// configuration (no repave, the installation's admission unchanged).
func TestMetricsNotFingerprinted(t *testing.T) {
	off := mustParse(t, minimal)
	on := mustParse(t, minimal+"\n[metrics]\nlisten = \"127.0.0.1:9469\"\n")
	if off.Fingerprint() != on.Fingerprint() {
		t.Error("[metrics] changed the fingerprint")
	}
	b, err := on.Canonical()
	if err != nil || strings.Contains(string(b), "9469") {
		t.Errorf("canonical form carries [metrics]: %s %v", b, err)
	}
}
