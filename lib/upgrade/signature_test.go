package upgrade

import (
	"crypto/rand"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"aead.dev/minisign"

	"github.com/kubeslot/kubeslot/lib/release"
)

// With trusted keys, a bundle signed by one of them upgrades; one signed by
// another key, with no signature at its URL, or on a host whose keys could
// not be read, is refused before anything
// is unpacked (the inactive release stays as it was), whoever asked. The
// signature is fetched for real, from <bundle URL>.minisig.
func TestSignedBundles(t *testing.T) {
	pub, priv, err := minisign.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, otherPriv, err := minisign.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pubText, _ := pub.MarshalText()
	sign := func(k minisign.PrivateKey, p string) []byte {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		r := minisign.NewReader(f)
		if _, err := io.Copy(io.Discard, r); err != nil {
			t.Fatal(err)
		}
		return r.Sign(k)
	}
	for _, tc := range []struct {
		name    string
		key     *minisign.PrivateKey // nil: no signature served
		keysErr error                // the keys could not be read
		ok      bool
	}{
		{"trusted", &priv, nil, true},
		{"another key", &otherPriv, nil, false},
		{"no signature", nil, nil, false},
		{"keys unreadable", &priv, errors.New("config.toml: broken"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.d.TrustedKeys, e.d.Signature, e.d.TrustedKeysErr = []string{string(pubText)}, FetchSignature, tc.keysErr
			p, sha := e.makeBundle("2.0", bundleOpts{})
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			mux := http.NewServeMux()
			mux.HandleFunc("/b.tar.gz", func(w http.ResponseWriter, r *http.Request) { w.Write(data) })
			if tc.key != nil {
				sig := sign(*tc.key, p)
				mux.HandleFunc("/b.tar.gz.minisig", func(w http.ResponseWriter, r *http.Request) { w.Write(sig) })
			}
			e.srv.Config.Handler = mux
			inactive, _ := release.Inactive(e.root)
			e.request(e.srv.URL+"/b.tar.gz", sha)
			res, err := Run(t.Context(), e.d, e.job())
			if tc.ok {
				if err != nil || res.Outcome != Upgraded {
					t.Fatalf("signed by a trusted key: %+v, %v", res, err)
				}
				return
			}
			if err == nil || res == nil || res.Outcome == Upgraded || !strings.Contains(err.Error(), "nothing unpacked") {
				t.Fatalf("%s: %+v, %v: want refused before unpacking", tc.name, res, err)
			}
			dir, _ := release.Dir(e.root, inactive)
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Errorf("%s: the inactive release %s holds %d entries after a refused bundle", tc.name, inactive, len(ents))
			}
		})
	}
}
