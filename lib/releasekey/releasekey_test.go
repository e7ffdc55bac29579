package releasekey

import "testing"

func TestParse(t *testing.T) {
	const line = "RWS5LMcFX+hKAW9/FLgWCFfGzuLsOtAGj9pLDhzUMY68MGvnv7SEE4Wg"
	for _, s := range []string{line, "untrusted comment: minisign public key\n" + line + "\n"} {
		if _, err := Parse(s); err != nil {
			t.Errorf("%q: %v", s, err)
		}
	}
	if _, err := Parse("RWQnot-a-key"); err == nil {
		t.Error("a broken key parsed")
	}
}
