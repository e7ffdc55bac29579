package config

import (
	"strings"
	"testing"
)

// noKubelet is minimal without [artifacts.kubelet].
func noKubelet() string {
	return without(without(minimal, "artifacts.kubelet", "url"), "artifacts.kubelet", "sha256")
}

func TestReleaseMirrorReplacesKubeletArtifact(t *testing.T) {
	c := mustParse(t, with(noKubelet(), "kubernetes.release", `mirror = "https://dl.example.com/release"`))
	if _, err := c.KubeletArtifact(); err == nil || !strings.Contains(err.Error(), "kubernetes.release.mirror") {
		t.Errorf("unpinned kubelet: %v, want an error naming the mirror", err)
	}
	fp := c.Fingerprint()
	pin := Artifact{URL: "https://dl.example.com/release/v1.37.2/bin/linux/amd64/kubelet", SHA256: strings.Repeat("ab", 32)}
	c.Artifacts.KubeletPinned = &pin
	if got, err := c.KubeletArtifact(); err != nil || got != pin {
		t.Errorf("pinned kubelet: %v %v, want %v", got, err, pin)
	}
	if c.Fingerprint() != fp {
		t.Error("the pin changed the fingerprint: a Machine spec (never pinned) would always differ from the applied configuration")
	}
	if d := c.Digests(); !strings.Contains(strings.Join(d, " "), pin.SHA256) {
		t.Errorf("Digests %v lack the pinned kubelet: a cache prune would remove it", d)
	}
	// An explicit artifact wins over the mirror.
	c2 := mustParse(t, with(minimal, "kubernetes.release", `mirror = "https://dl.example.com/release"`))
	if got, _ := c2.KubeletArtifact(); got.URL != "https://dl.k8s.io/release/v1.37.2/bin/linux/amd64/kubelet" {
		t.Errorf("explicit artifacts.kubelet lost to the mirror: %v", got)
	}
}

func TestReleaseMirrorErrors(t *testing.T) {
	for name, tc := range map[string]struct{ doc, key, msg string }{
		"no kubelet and no mirror": {noKubelet(), "artifacts.kubelet.url", "missing"},
		"mirror not a URL": {with(noKubelet(), "kubernetes.release", `mirror = "dl.example.com/release"`),
			"kubernetes.release.mirror", "https URL"},
		"plain http mirror": {with(noKubelet(), "kubernetes.release", `mirror = "http://dl.example.com/release"`),
			"kubernetes.release.mirror", `"http://dl.example.com/release": must be https`},
		"pin without mirror": {with(minimal, "kubernetes.release.kubelet_sha256", `"1.37.2" = "`+strings.Repeat("ab", 32)+`"`),
			"kubernetes.release.mirror", "kubelet_sha256"},
		"pin not a digest": {with(with(noKubelet(), "kubernetes.release", `mirror = "https://m.example.com"`), "kubernetes.release.kubelet_sha256", `"1.37.2" = "abc"`),
			`kubernetes.release.kubelet_sha256."1.37.2"`, `"abc": must be a sha256 digest`},
		"pin key not a version": {with(with(noKubelet(), "kubernetes.release", `mirror = "https://m.example.com"`), "kubernetes.release.kubelet_sha256", `"latest" = "`+strings.Repeat("ab", 32)+`"`),
			"kubernetes.release.kubelet_sha256.latest", "MAJOR.MINOR.PATCH"},
		"mirror with query": {with(noKubelet(), "kubernetes.release", `mirror = "https://dl.example.com/r?sig=secret"`),
			"kubernetes.release.mirror", "query"},
		"ca on http": {with(with(noKubelet(), "kubernetes.release", `mirror = "http://dl.example.com/release"`), "kubernetes.release", `ca_file = "/etc/ca.crt"`),
			"kubernetes.release.ca_file", "https mirror only"},
		"ca without mirror": {with(minimal, "kubernetes.release", `ca_file = "/etc/ca.crt"`),
			"kubernetes.release.mirror", "no mirror"},
		"both cas": {with(with(with(noKubelet(), "kubernetes.release", `mirror = "https://m.example.com"`), "kubernetes.release", `ca_file = "/etc/ca.crt"`), "kubernetes.release", `ca_pem = "x"`),
			"kubernetes.release.ca_pem", "not both"},
	} {
		t.Run(name, func(t *testing.T) {
			errs := parseErrors(t, tc.doc)
			for _, e := range errs {
				if e.Key == tc.key && strings.Contains(e.Error(), tc.msg) {
					if strings.Contains(e.Error(), "secret") {
						t.Errorf("error shows the query: %v", e)
					}
					return
				}
			}
			t.Errorf("errors %v: want one on %s containing %q", errs, tc.key, tc.msg)
		})
	}
}

// A local mirror stays allowed, and pins are normalised like every digest
// (a "v" before the version, uppercase hex) so the fingerprint sees one form.
func TestReleasePinsAndLocalMirror(t *testing.T) {
	up := strings.Repeat("AB", 32)
	doc := with(with(noKubelet(), "kubernetes.release", `mirror = "/srv/k8s/release"`), "kubernetes.release.kubelet_sha256", `"v1.37.2" = "`+up+`"`)
	c := mustParse(t, doc)
	if got := c.Kubernetes.Release.KubeletSHA256; len(got) != 1 || got["1.37.2"] != strings.ToLower(up) {
		t.Errorf("pins %v, want 1.37.2 = lowercase digest", got)
	}
	plain := mustParse(t, with(noKubelet(), "kubernetes.release", `mirror = "/srv/k8s/release"`))
	if plain.Fingerprint() == c.Fingerprint() {
		t.Error("a pin is a setting: it must change the fingerprint")
	}
}

func TestUnpinnedKubeletWarning(t *testing.T) {
	remote := with(noKubelet(), "kubernetes.release", `mirror = "https://dl.example.com/release"`)
	w := mustParse(t, remote).UnpinnedKubeletWarning()
	for _, want := range []string{"1.37.2", "https://dl.example.com/release", "kubelet_sha256"} {
		if !strings.Contains(w, want) {
			t.Errorf("warning %q lacks %q", w, want)
		}
	}
	for name, doc := range map[string]string{
		"pinned":        with(remote, "kubernetes.release.kubelet_sha256", `"1.37.2" = "`+strings.Repeat("ab", 32)+`"`),
		"explicit file": minimal,
		"local mirror":  with(noKubelet(), "kubernetes.release", `mirror = "/srv/k8s/release"`),
		"explicit wins": with(minimal, "kubernetes.release", `mirror = "https://dl.example.com/release"`),
	} {
		if w := mustParse(t, doc).UnpinnedKubeletWarning(); w != "" {
			t.Errorf("%s: warning %q", name, w)
		}
	}
	if w := mustParse(t, with(remote, "kubernetes.release.kubelet_sha256", `"1.36.0" = "`+strings.Repeat("ab", 32)+`"`)).UnpinnedKubeletWarning(); w == "" {
		t.Error("a pin for another version does not pin kubernetes.version")
	}
}

// Timeouts whose worst case does not fit in a worker unit's own start
// timeout are refused, naming the sum and the bound.
func TestTimeoutsFitTheStageBudget(t *testing.T) {
	errs := parseErrors(t, with(minimal, "timeouts", `download = "20m"`))
	found := false
	for _, e := range errs {
		found = found || (e.Key == "timeouts.download" && strings.Contains(e.Error(), "= 33m30s, exceeds the 28m0s"))
	}
	if !found {
		t.Errorf("errors %v: want timeouts.download naming the worst case 33m30s and the 28m budget", errs)
	}
	if c := mustParse(t, minimal); c.Timeouts.Lock.Duration+c.Timeouts.Download.Duration+2*(c.Timeouts.Stop.Duration+c.Timeouts.NodeReady.Duration) > StageBudget {
		t.Error("the defaults do not fit the stage budget")
	}
}
