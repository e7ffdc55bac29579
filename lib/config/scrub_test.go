package config

import (
	"strings"
	"testing"
)

const scrubNote = "bootstrap_token removed by the reset"

// TestRemoveJoinTokenExample: the example configuration loses its token and
// nothing else; it parses again once a fresh token is put where the note is.
func TestRemoveJoinTokenExample(t *testing.T) {
	in := string(Example())
	out, removed, err := RemoveJoinToken([]byte(in), scrubNote)
	if err != nil || !removed {
		t.Fatalf("removed %v, err %v", removed, err)
	}
	if strings.Contains(string(out), testToken) {
		t.Fatalf("the token is still there:\n%s", out)
	}
	// Every other byte as it was: the one line became the note.
	want := strings.Replace(in, `bootstrap_token = "`+testToken+`"`, "# "+scrubNote, 1)
	if string(out) != want {
		t.Errorf("other bytes changed:\n--- got\n%s\n--- want\n%s", out, want)
	}
	// Without a token it is still a configuration (a joined node's
	// credential is its identity): it parses, holding no join credential.
	if c, err := Parse("config.toml", out); err != nil || c.Cluster.BootstrapToken != "" {
		t.Errorf("parse without the token: %v", err)
	}
	fresh := strings.Replace(string(out), "# "+scrubNote, `bootstrap_token = "zzzzzz.yyyyyyyyyyyyyyyy"`, 1)
	if _, err := Parse("config.toml", []byte(fresh)); err != nil {
		t.Errorf("with a fresh token: %v", err)
	}
	// A second run finds nothing to do.
	again, removed, err := RemoveJoinToken(out, scrubNote)
	if err != nil || removed || string(again) != string(out) {
		t.Errorf("second run: removed %v, changed %v, err %v", removed, string(again) != string(out), err)
	}
	if has, err := HasJoinToken(out); has || err != nil {
		t.Errorf("HasJoinToken after removal: %v %v", has, err)
	}
	if has, err := HasJoinToken([]byte(in)); !has || err != nil {
		t.Errorf("HasJoinToken before removal: %v %v", has, err)
	}
}

// TestRemoveJoinTokenForms: every way TOML can write the token, and what
// must stay.
func TestRemoveJoinTokenForms(t *testing.T) {
	const tok = testToken
	note := "# " + scrubNote
	cases := []struct{ name, in, want string }{
		{"trailing comment kept",
			"[cluster]\nserver = \"https://h\"\nbootstrap_token = \"" + tok + "\"   # from the vault\nca_file = \"/ca\"\n",
			"[cluster]\nserver = \"https://h\"\n" + note + "   # from the vault\nca_file = \"/ca\"\n"},
		{"indented, CRLF",
			"[cluster]\r\n  bootstrap_token = \"" + tok + "\"\r\n[machine]\r\nname = \"w\"\r\n",
			"[cluster]\r\n  " + note + "\r\n[machine]\r\nname = \"w\"\r\n"},
		{"literal string",
			"[cluster]\nbootstrap_token = '" + tok + "'\n",
			"[cluster]\n" + note + "\n"},
		{"multi-line string",
			"[cluster]\nbootstrap_token = \"\"\"\n" + tok + "\"\"\"\nserver = \"https://h\"\n",
			"[cluster]\n" + note + "\nserver = \"https://h\"\n"},
		{"dotted key at the top",
			"cluster.bootstrap_token = \"" + tok + "\"\n[machine]\nname = \"w\"\n",
			note + "\n[machine]\nname = \"w\"\n"},
		{"quoted key",
			"[\"cluster\"]\n\"bootstrap_token\" = \"" + tok + "\"\n",
			"[\"cluster\"]\n" + note + "\n"},
		{"inline table",
			"cluster = { server = \"https://h\", bootstrap_token = \"" + tok + "\", ca_file = \"/ca\" }\n",
			"cluster = { server = \"https://h\", bootstrap_token = \"\", ca_file = \"/ca\" }\n"},
		{"a table made of it",
			"[cluster.bootstrap_token]\nvalue = \"" + tok + "\"\n",
			"[cluster.bootstrap_token]\n" + note + "\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, removed, err := RemoveJoinToken([]byte(c.in), scrubNote)
			if err != nil || !removed {
				t.Fatalf("removed %v, err %v", removed, err)
			}
			if string(out) != c.want {
				t.Errorf("got\n%q\nwant\n%q", out, c.want)
			}
			if strings.Contains(string(out), tok) {
				t.Errorf("the token is still there: %q", out)
			}
		})
	}

	keep := map[string]string{
		"kubeconfig instead":         "[cluster]\nkubeconfig = \"/etc/kubeslot/join.kubeconfig\"\n",
		"same key in another table":  "[node]\nbootstrap_token = \"x\"\n",
		"only in a comment":          "[cluster]\n# bootstrap_token = \"" + tok + "\"\n",
		"in a string":                "[machine]\nname = \"bootstrap_token = 1\"\n",
		"empty in an inline table":   "cluster = { bootstrap_token = \"\" }\n",
		"cluster key of another one": "[x]\ncluster.bootstrap_token = \"y\"\n",
	}
	for name, in := range keep {
		t.Run("keeps "+name, func(t *testing.T) {
			out, removed, err := RemoveJoinToken([]byte(in), scrubNote)
			if err != nil || removed || string(out) != in {
				t.Errorf("removed %v, err %v, out %q", removed, err, out)
			}
		})
	}
}

func TestRemoveJoinTokenRefuses(t *testing.T) {
	cases := map[string]struct{ in, note, want string }{
		"not TOML":                  {"[cluster]\nserver = \"https://h\"\nbootstrap_token = \"" + testToken + "\nx = 1\n", scrubNote, "line 3"},
		"not TOML, no token":        {"[cluster\n", scrubNote, "line 1"},
		"note of two lines":         {minimal, "a\nb", "one line"},
		"inline token not a string": {"cluster = { bootstrap_token = [\"" + testToken + "\"] }\n", scrubNote, "cluster.bootstrap_token"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			out, removed, err := RemoveJoinToken([]byte(c.in), c.note)
			if err == nil || removed || out != nil {
				t.Fatalf("accepted: removed %v, out %q", removed, out)
			}
			if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "0123456789abcdef") {
				t.Errorf("error %q: want %q in it and no token", err, c.want)
			}
		})
	}
}
