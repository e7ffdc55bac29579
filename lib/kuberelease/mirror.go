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

// Client is the HTTP client for downloads from rel's mirror: nil (the
// default client) unless rel names a CA.
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
	if len(pem) == 0 {
		return nil, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("kubernetes.release: the mirror's CA holds no PEM certificate")
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	tr.ResponseHeaderTimeout = 30 * time.Second
	return &http.Client{Transport: tr}, nil
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
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", artifact.Redact(source), resp.Status)
	}
	return io.ReadAll(io.LimitReader(resp.Body, checksumMax))
}

// Pin finds cfg's kubelet on its release mirror and records it in
// cfg.Artifacts.KubeletPinned. It does nothing when artifacts.kubelet is
// set (an explicit file wins), when the configuration names no mirror, or
// when the pin is already for this version on this mirror: a resumed
// transition installs what it started with.
func Pin(ctx context.Context, m *Mirror, cfg *config.Config) error {
	rel := cfg.Kubernetes.Release
	if cfg.Artifacts.Kubelet.URL != "" || rel.Mirror == "" {
		return nil
	}
	u := KubeletURL(rel.Mirror, cfg.Kubernetes.Version)
	if p := cfg.Artifacts.KubeletPinned; p != nil && p.URL == u {
		return nil
	}
	sum, err := m.Checksum(ctx, u)
	if err != nil {
		return fmt.Errorf("kubelet %s on the release mirror (kubernetes.release.mirror): %w", cfg.Kubernetes.Version, err)
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
