package kuberelease

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"runtime"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/artifact"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// KubeletPath is where a release tree keeps the kubelet of version for
// arch, relative to the mirror's base.
func KubeletPath(version, arch string) string {
	return "v" + version + "/bin/linux/" + arch + "/kubelet"
}

// KubeletURL is the kubelet of version on mirror for this host's
// architecture (GOARCH names match the release tree's).
func KubeletURL(mirror, version string) string {
	return strings.TrimRight(mirror, "/") + "/" + KubeletPath(version, runtime.GOARCH)
}

// Mirror reads a release mirror's small files (the .sha256 beside each
// binary). The zero value is not usable: use NewMirror.
type Mirror struct {
	root   *hostroot.Root
	client *http.Client
}

// checksumTimeout bounds one read of a published checksum, and
// checksumMax its size: the file is one digest, maybe with a name.
const (
	checksumTimeout = 30 * time.Second
	checksumMax     = 4 << 10
)

// NewMirror makes the reader for rel: an https mirror is trusted through
// rel's CA when it has one, else through the system's roots. Local paths
// are read through root.
func NewMirror(root *hostroot.Root, rel config.Release) (*Mirror, error) {
	c, err := Client(root, rel)
	if err != nil {
		return nil, err
	}
	return &Mirror{root: root, client: c}, nil
}

// Client is the HTTP client for downloads from rel's mirror: trusting
// rel's CA when it names one, else the system's roots, and never following
// a redirect off https (see refuseInsecureRedirect).
func Client(root *hostroot.Root, rel config.Release) (*http.Client, error) {
	pem := []byte(rel.CAPEM)
	if rel.CAFile != "" {
		p, err := root.Resolve(rel.CAFile)
		if err != nil {
			return nil, fmt.Errorf("kubernetes.release.ca_file: %w", err)
		}
		if pem, err = os.ReadFile(p); err != nil {
			return nil, fmt.Errorf("kubernetes.release.ca_file: %w", err)
		}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ResponseHeaderTimeout = 30 * time.Second
	if len(pem) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, errors.New("kubernetes.release: the mirror's CA holds no PEM certificate")
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{Transport: tr, CheckRedirect: refuseInsecureRedirect}, nil
}

// ErrInsecureRedirect is what a redirect from the https mirror to a URL that
// is not https fails with: whoever answers plain http would pick the file.
var ErrInsecureRedirect = errors.New("redirect away from https refused")

// refuseInsecureRedirect lets the mirror redirect (a CDN commonly does)
// only to https, and at most 10 times like the default policy.
func refuseInsecureRedirect(req *http.Request, via []*http.Request) error {
	if req.URL.Scheme != "https" {
		from := via[len(via)-1].URL
		return fmt.Errorf("%w: %s redirected to %s", ErrInsecureRedirect, artifact.Redact(from.String()), artifact.Redact(req.URL.String()))
	}
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	return nil
}

// CheckMirror refuses a mirror that is neither an https URL nor an
// absolute local path: over plain http whoever answers on the network
// picks both the kubelet, which runs as root, and its digest. field names
// the setting in the error.
func CheckMirror(field, mirror string) error {
	if strings.HasPrefix(mirror, "/") || strings.HasPrefix(mirror, "https://") {
		return nil
	}
	return fmt.Errorf("%s %q: the release mirror must be an https URL or an absolute local path", field, artifact.Redact(mirror))
}

var digestRE = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)

// Checksum reads the sha256 published for source (source + ".sha256"):
// the file holds the hex digest, alone as upstream publishes it or
// followed by a file name as sha256sum writes it.
func (m *Mirror) Checksum(ctx context.Context, source string) (string, error) {
	b, err := m.read(ctx, source+".sha256")
	if err != nil {
		return "", err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 || !digestRE.MatchString(f[0]) {
		return "", fmt.Errorf("%s.sha256: not a sha256 digest", artifact.Redact(source))
	}
	return strings.ToLower(f[0]), nil
}

func (m *Mirror) read(ctx context.Context, source string) ([]byte, error) {
	if strings.HasPrefix(source, "/") {
		p, err := m.root.Resolve(source)
		if err != nil {
			return nil, err
		}
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		return io.ReadAll(io.LimitReader(f, checksumMax))
	}
	ctx, cancel := context.WithTimeout(ctx, checksumTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, source, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", artifact.Redact(source), err)
	}
	c := m.client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL may carry a signature; Redact names it
		}
		return nil, fmt.Errorf("%s: %w", artifact.Redact(source), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, fmt.Errorf("%s: %s: %w", artifact.Redact(source), resp.Status, os.ErrNotExist)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", artifact.Redact(source), resp.Status)
	}
	return io.ReadAll(io.LimitReader(resp.Body, checksumMax))
}

// Pin finds cfg's kubelet on its release mirror and records it in
// cfg.Artifacts.KubeletPinned. It does nothing when artifacts.kubelet is
// set (an explicit file wins), when the configuration names no mirror, or
// when the pin is already for this version on this mirror (and agrees with
// the operator's digest): a resumed transition installs what it started
// with.
//
// The digest recorded is the operator's kubernetes.release.kubelet_sha256
// for the version when there is one; the mirror's own .sha256 then only has
// to agree with it, and may be missing. Without a pin the mirror's digest is
// all there is: it catches a corrupted download, not a hostile mirror.
func Pin(ctx context.Context, m *Mirror, cfg *config.Config) error {
	rel := cfg.Kubernetes.Release
	if cfg.Artifacts.Kubelet.URL != "" || rel.Mirror == "" {
		return nil
	}
	if err := CheckMirror("kubernetes.release.mirror", rel.Mirror); err != nil {
		return err
	}
	v := cfg.Kubernetes.Version
	u := KubeletURL(rel.Mirror, v)
	want := rel.KubeletSHA256[v]
	if p := cfg.Artifacts.KubeletPinned; p != nil && p.URL == u && (want == "" || p.SHA256 == want) {
		return nil
	}
	sum, err := m.Checksum(ctx, u)
	switch {
	case err != nil && (want == "" || !errors.Is(err, os.ErrNotExist)):
		return fmt.Errorf("kubelet %s on the release mirror (kubernetes.release.mirror): %w", v, err)
	case err == nil && want != "" && sum != want:
		return fmt.Errorf("kubelet %s: the release mirror's %s.sha256 is %s, but kubernetes.release.kubelet_sha256 pins %q = %q: refusing a kubelet the operator did not pin",
			v, artifact.Redact(u), sum, v, want)
	case want != "":
		sum = want
	}
	cfg.Artifacts.KubeletPinned = &config.Artifact{URL: u, SHA256: sum}
	return nil
}

// Pinner pins configurations' kubelets from their own release mirrors,
// reading local mirrors and CA files through Root.
type Pinner struct{ Root *hostroot.Root }

// Pin is the package's Pin with cfg's own mirror.
func (p Pinner) Pin(ctx context.Context, cfg *config.Config) error {
	if cfg.Artifacts.Kubelet.URL != "" || cfg.Kubernetes.Release.Mirror == "" {
		return nil
	}
	m, err := NewMirror(p.Root, cfg.Kubernetes.Release)
	if err != nil {
		return err
	}
	return Pin(ctx, m, cfg)
}
