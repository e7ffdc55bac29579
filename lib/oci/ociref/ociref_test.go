package ociref

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	sha := strings.Repeat("ab", 32)
	cases := []struct {
		src, pinned, tag string
		loopback         bool
	}{
		{"oci://127.0.0.1:5000/x", "127.0.0.1:5000/x@sha256:" + sha, "", true},
		{"oci://localhost:5000/node/x:v1", "localhost:5000/node/x@sha256:" + sha, "v1", true},
		{"oci://[::1]:5000/x", "[::1]:5000/x@sha256:" + sha, "", true},
		{"oci://registry.example:5000/node/bookworm:1.2@sha256:" + sha, "registry.example:5000/node/bookworm@sha256:" + sha, "1.2", false},
		{"oci://10.0.0.5/node", "10.0.0.5/node@sha256:" + sha, "", false},
	}
	for _, c := range cases {
		r, err := Parse(c.src, strings.ToUpper(sha))
		if err != nil {
			t.Errorf("%s: %v", c.src, err)
			continue
		}
		if r.String() != c.pinned || r.Tag != c.tag || r.Loopback != c.loopback {
			t.Errorf("%s: got %s tag %q loopback %v", c.src, r, r.Tag, r.Loopback)
		}
		// Only a loopback registry is reached over http.
		if c.loopback && r.Digest.Context().Registry.Scheme() != "http" {
			t.Errorf("%s: scheme %s", c.src, r.Digest.Context().Registry.Scheme())
		}
	}
	for _, bad := range []string{"https://x/y", "oci://u:p@h.example/x", "oci://h.example/x@sha512:00", "oci://x", "oci://h.example/", "oci://h.example/a@sha256:" + strings.Repeat("cd", 32)} {
		if _, err := Parse(bad, sha); err == nil {
			t.Errorf("%s accepted", bad)
		} else if strings.Contains(err.Error(), "u:p") {
			t.Errorf("%s: error repeats the credentials: %v", bad, err)
		}
	}
}
