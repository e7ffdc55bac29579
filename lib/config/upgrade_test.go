package config

import (
	"strings"
	"testing"
)

// [upgrade] trusted_keys: minisign public keys, read and not fingerprinted;
// anything else is refused naming the field and the entry.
func TestUpgradeTrustedKeys(t *testing.T) {
	const key = "RWS5LMcFX+hKAW9/FLgWCFfGzuLsOtAGj9pLDhzUMY68MGvnv7SEE4Wg"
	c := mustParse(t, minimal+"\n[upgrade]\ntrusted_keys = [\""+key+"\"]\n")
	if len(c.Upgrade.TrustedKeys) != 1 || c.Upgrade.TrustedKeys[0] != key {
		t.Errorf("trusted keys %q", c.Upgrade.TrustedKeys)
	}
	if c.Fingerprint() != mustParse(t, minimal).Fingerprint() {
		t.Error("[upgrade] changed the fingerprint")
	}
	errs := parseErrors(t, minimal+"\n[upgrade]\ntrusted_keys = [\""+key+"\", \"RWQbroken\"]\n")
	if len(errs) != 1 || errs[0].Key != "upgrade.trusted_keys" || !strings.Contains(errs[0].Value, "[1]") || !strings.Contains(errs[0].Msg, "minisign public key") {
		t.Errorf("a broken key: %v", errs)
	}
}
