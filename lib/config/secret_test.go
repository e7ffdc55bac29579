package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

func TestSecretFormatting(t *testing.T) {
	s := Secret(testToken)
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%10s", "%T %v"} {
		if out := fmt.Sprintf(verb, s); strings.Contains(out, testToken) || strings.Contains(out, "abcdef") {
			t.Errorf("Sprintf(%q) = %q leaks the token", verb, out)
		}
	}
	if got := fmt.Sprintf("%v|%s|%#v|%q", s, s.String(), s, s); got != `[redacted]|[redacted]|config.Secret("[redacted]")|"[redacted]"` {
		t.Errorf("redacted forms: %s", got)
	}
	if got := fmt.Sprint(Secret("")); got != "" {
		t.Errorf("empty secret prints %q, want empty", got)
	}
	if s.Reveal() != testToken {
		t.Errorf("Reveal() = %q", s.Reveal())
	}
	b, _ := json.Marshal(s)
	txt, _ := s.MarshalText()
	if string(b) != `"`+testToken+`"` || string(txt) != testToken {
		t.Errorf("JSON %s and text %s must keep the value", b, txt)
	}
}

// The token must not come out of a parsed config through fmt or slog.
func TestTokenNotPrinted(t *testing.T) {
	// A token whose secret half appears nowhere else in the document.
	const token, secretHalf = "q7x2pz.s3cr3tv4lu3zzzzz", "s3cr3tv4lu3zzzzz"
	cfg := mustParse(t, strings.Replace(string(Example()), testToken, token, 1))
	if cfg.Cluster.BootstrapToken.Reveal() != token {
		t.Fatal("token not replaced in the example")
	}
	// Held as any so vet lets %s through: people do write that.
	var value, pointer, cluster any = *cfg, cfg, cfg.Cluster
	outputs := map[string]string{
		//lint:ignore SA5009 %s on purpose: the secret must not leak that way either
		"fmt config": fmt.Sprintf("%v %+v %#v %s", value, value, value, value),
		//lint:ignore SA5009 %s on purpose, as above
		"fmt pointer": fmt.Sprintf("%v %+v %#v %s", pointer, pointer, pointer, pointer),
		"fmt cluster": fmt.Sprintf("%v %+v %#v %s", cluster, cluster, cluster, cluster),
		"summary":     cfg.Summary(),
	}
	for name, h := range map[string]func(*bytes.Buffer) slog.Handler{
		"json": func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) },
		"text": func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) },
	} {
		var buf bytes.Buffer
		log := slog.New(h(&buf))
		log.Info("config", "config", cfg, "value", *cfg, "cluster", cfg.Cluster, "token", cfg.Cluster.BootstrapToken)
		log.Info("nested", slog.Group("g", "config", cfg))
		outputs["slog "+name] = buf.String()
	}
	for name, out := range outputs {
		if strings.Contains(out, secretHalf) {
			t.Errorf("%s leaks the token:\n%s", name, out)
		}
	}
	// The log line is still useful: it names the node and the credential
	// kind, with the token's public id.
	if out := outputs["slog json"]; !strings.Contains(out, `"credential":"bootstrap token q7x2pz"`) || !strings.Contains(out, `"machine":"worker-1"`) {
		t.Errorf("slog output lacks identifying fields:\n%s", out)
	}
}

// No error about the token, whatever is wrong with it, may show it.
func TestTokenNotInErrors(t *testing.T) {
	// Each has the distinctive run "s3cr3t" in its secret part.
	tokens := []string{
		"q7x2pzs3cr3tv4lu3zzzzz",   // no dot
		"q7x2pz.s3cr3tv4lu3zzzzZ",  // bad character
		"q7x2pz.s3cr3tv4lu3zzzzz0", // too long
		"q7.x2pzs3cr3tv4lu3zzzzz",  // id too short
	}
	for _, tok := range tokens {
		docs := []string{
			with(minimal, "cluster", `bootstrap_token = "`+tok+`"`),
			with(minimal, "cluster", `bootstrap_token = ["`+tok+`"]`),
			with(minimal, "cluster", `bootstrap_token = `+tok),
			with(minimal, "cluster", `bootstrap_token = "`+tok),
			with(without(minimal, "cluster", "bootstrap_token"), "cluster", `bootstrap_tokn = "`+tok+`"`),
		}
		for _, doc := range docs {
			_, err := Parse("test.toml", []byte(doc))
			if err == nil {
				t.Errorf("token %q: Parse succeeded:\n%s", tok, doc)
				continue
			}
			if out := fmt.Sprintf("%v %+v %#v", err, err, err); strings.Contains(out, "s3cr3t") {
				t.Errorf("error leaks the token:\n%s", out)
			}
		}
	}
}
