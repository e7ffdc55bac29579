package config

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"maps"
	"net/netip"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/oci/ociref"
)

// Validate checks a configuration whose defaults have been applied and
// returns Errors listing every problem (no file name or lines: Parse adds
// those), or nil. It does not touch the filesystem: paths are checked for
// form only, so a file can be checked on another machine.
func (c *Config) Validate() error {
	var v validator
	v.machine(&c.Machine)
	v.cluster(&c.Cluster)
	v.kubernetes(&c.Kubernetes)
	v.release(&c.Kubernetes.Release)
	v.required([]string{"rootfs", "source"}, c.RootFS.Source, v.rootfsSource(c.RootFS.SHA256))
	v.required([]string{"rootfs", "sha256"}, c.RootFS.SHA256, v.sha256)
	for _, a := range c.artifacts() {
		if a.a == nil {
			continue // optional, and absent: the rootfs provides it
		}
		v.required([]string{"artifacts", a.name, "url"}, a.a.URL, v.source)
		v.required([]string{"artifacts", a.name, "sha256"}, a.a.SHA256, v.sha256)
	}
	v.isolation(&c.Isolation)
	v.node(&c.Node)
	for _, t := range c.timeouts() {
		v.timeout(t.path, t.d.Duration)
	}
	v.stageBudget(&c.Timeouts)
	v.metrics(&c.Metrics)
	v.upgrade(&c.Upgrade)
	if len(v.errs) == 0 {
		return nil
	}
	return v.errs
}

type validator struct{ errs Errors }

func (v *validator) fail(path []string, value, format string, args ...any) {
	v.errs = append(v.errs, newError(path, value, format, args...))
}

// required reports an empty value as missing, and checks the others.
func (v *validator) required(path []string, s string, check func([]string, string)) {
	if s == "" {
		v.errs = append(v.errs, missingError(path, ""))
		return
	}
	check(path, s)
}

var (
	labelRE     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	versionRE   = regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)
	sha256RE    = regexp.MustCompile(`^[0-9a-f]{64}$`)
	anySHA256RE = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)
	tokenRE     = regexp.MustCompile(`^([a-z0-9]{6})\.([a-z0-9]{16})$`)
	// A slot names a machine (a hostname label): no '-' at its end.
	slotRE = regexp.MustCompile(`^[a-z]([a-z0-9-]{0,14}[a-z0-9])?$`)
	// Kubernetes label names and values (without the prefix).
	qualifiedRE = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
)

const (
	dnsLabelHelp      = "must be a DNS-1123 label: at most 63 characters of lowercase letters, digits and '-', starting and ending with a letter or digit"
	dnsSubdomainHelp  = "must be a DNS-1123 subdomain: dot-separated DNS-1123 labels (lowercase letters, digits and '-'), at most 253 characters"
	sourceHelp        = "must be an http(s) URL with a host or an absolute path"
	releaseMirrorHelp = "must be an https URL with a host or an absolute path, the base of a tree laid out like https://dl.k8s.io/release"
	rootfsSourceHelp  = sourceHelp + ", or an OCI image \"oci://<registry>/<repository>[:<tag>]\" (then rootfs.sha256 is the image manifest digest)"
)

func isDNSLabel(s string) bool { return len(s) <= 63 && labelRE.MatchString(s) }

func isDNSSubdomain(s string) bool {
	if len(s) > 253 {
		return false
	}
	for l := range strings.SplitSeq(s, ".") {
		if !isDNSLabel(l) {
			return false
		}
	}
	return true
}

func (v *validator) machine(m *Machine) {
	if m.Name == "" && m.NodeName == "" {
		// The host's name, at the stage (NameFromHost): one file for a
		// fleet.
		return
	}
	v.required([]string{"machine", "name"}, m.Name, func(p []string, s string) {
		if !isDNSLabel(s) {
			v.fail(p, quote(s), "%s", dnsLabelHelp)
		}
	})
	if m.NodeName == m.Name {
		// node_name defaulted to name (or repeats it): the name check covers
		// it, since a DNS-1123 label is also a subdomain.
		return
	}
	v.required([]string{"machine", "node_name"}, m.NodeName, func(p []string, s string) {
		if !isDNSSubdomain(s) {
			v.fail(p, quote(s), "%s", dnsSubdomainHelp)
		}
	})
}

func (v *validator) cluster(c *Cluster) {
	v.required([]string{"cluster", "server"}, c.Server, v.server)

	switch {
	case c.CAFile == "" && c.CAPEM == "":
		v.errs = append(v.errs, missingError([]string{"cluster", "ca_file"}, "set ca_file (a path) or ca_pem (inline PEM), exactly one"))
	case c.CAFile != "" && c.CAPEM != "":
		v.fail([]string{"cluster", "ca_pem"}, "", "conflicts with cluster.ca_file: set ca_file or ca_pem, not both")
	case c.CAFile != "":
		v.absPath([]string{"cluster", "ca_file"}, c.CAFile)
	default:
		v.caPEM([]string{"cluster", "ca_pem"}, c.CAPEM)
	}

	// Neither is valid: after its first join a node's credential is its
	// identity (lib/nodeidentity) and the bootstrap removes the token. A
	// stage that needs to join and has neither says so then, naming where
	// a fresh token goes (nodeconfig.LoadCredentials).
	switch {
	case c.BootstrapToken == "" && c.Kubeconfig == "":
	case c.BootstrapToken != "" && c.Kubeconfig != "":
		v.fail([]string{"cluster", "kubeconfig"}, "", "conflicts with cluster.bootstrap_token: set bootstrap_token or kubeconfig, not both")
	case c.BootstrapToken != "":
		v.token([]string{"cluster", "bootstrap_token"}, c.BootstrapToken)
	default:
		v.absPath([]string{"cluster", "kubeconfig"}, c.Kubeconfig)
	}
}

func (v *validator) server(p []string, s string) {
	u, err := url.Parse(s)
	switch {
	case err != nil || u.Scheme != "https" || u.Hostname() == "":
		v.fail(p, safeURL(s), `must be an https URL with a host, e.g. "https://203.0.113.10:6443"`)
	case u.User != nil:
		v.fail(p, safeURL(s), "must not contain credentials; use bootstrap_token or kubeconfig")
	case u.RawQuery != "" || u.Fragment != "":
		v.fail(p, safeURL(s), "must not have a query or fragment")
	}
}

// source checks an http(s) URL or absolute path to download from.
func (v *validator) source(p []string, s string) { v.sourceWithHelp(p, s, sourceHelp) }

func (v *validator) sourceWithHelp(p []string, s, help string) {
	if strings.HasPrefix(s, "/") {
		v.absPath(p, s)
		return
	}
	u, err := url.Parse(s)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "":
		v.fail(p, safeURL(s), "%s", help)
	case u.User != nil:
		v.fail(p, safeURL(s), "must not contain credentials")
	}
}

// rootfsSource accepts, besides what source does, an OCI image reference
// ("oci://registry/repo[:tag]"); any digest written in it must agree with
// rootfs.sha256, which is then the image manifest digest.
func (v *validator) rootfsSource(sha string) func([]string, string) {
	return func(p []string, s string) {
		if !ociref.Is(s) {
			v.sourceWithHelp(p, s, rootfsSourceHelp)
			return
		}
		if !sha256RE.MatchString(sha) {
			sha = "" // reported on rootfs.sha256; check the form only
		}
		if _, err := ociref.Parse(s, sha); err != nil {
			v.fail(p, safeURL(s), "%v", err)
		}
	}
}

// safeURL quotes a URL for an error without its credentials or query (a
// pre-signed download URL carries its signature there).
func safeURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || (u.User == nil && u.RawQuery == "") {
		return quote(s)
	}
	out := u.Scheme + "://"
	if u.User != nil {
		out += redacted + "@"
	}
	out += u.Host + u.EscapedPath()
	if u.RawQuery != "" {
		out += "?" + redacted
	}
	return quote(out)
}

func (v *validator) absPath(p []string, s string) {
	switch {
	case !filepath.IsAbs(s) || strings.ContainsRune(s, 0):
		v.fail(p, quote(s), "must be an absolute path")
	case filepath.Clean(s) != s:
		// "/srv/../../etc/shadow" is not what it seems to say.
		v.fail(p, quote(s), "must be a clean absolute path (no '.', '..', '//' or trailing '/'): %s", filepath.Clean(s))
	case strings.ContainsAny(s, "\n\r"):
		v.fail(p, quote(s), "must be an absolute path without line breaks")
	}
}

func (v *validator) sha256(p []string, s string) {
	if !sha256RE.MatchString(s) {
		v.fail(p, quote(s), "must be a sha256 digest: 64 hex digits (%d characters given)", len(s))
	}
}

// normalSHA256 lowercases a well-formed digest; others stay as written.
func normalSHA256(s string) string {
	if anySHA256RE.MatchString(s) {
		return strings.ToLower(s)
	}
	return s
}

// caPEM never shows the value: a mistaken paste may be a private key.
func (v *validator) caPEM(p []string, s string) {
	rest := []byte(s)
	certs := 0
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if strings.Contains(b.Type, "PRIVATE KEY") {
			v.fail(p, "", "contains a %s block: put only the cluster CA certificate here", b.Type)
			return
		}
		if b.Type != "CERTIFICATE" {
			v.fail(p, "", "contains a PEM %q block: want only CERTIFICATE blocks", b.Type)
			return
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			v.fail(p, "", "certificate %d does not parse: %v", certs+1, err)
			return
		}
		certs++
	}
	if certs == 0 {
		v.fail(p, "", "must hold at least one PEM certificate (-----BEGIN CERTIFICATE-----)")
	}
}

// token checks a bootstrap token's form without ever showing it.
func (v *validator) token(p []string, s Secret) {
	if tokenRE.MatchString(s.Reveal()) {
		return
	}
	hint := ""
	id, secret, found := strings.Cut(s.Reveal(), ".")
	switch {
	case !found:
		hint = " (there is no '.')"
	case len(id) != 6 || len(secret) != 16:
		hint = fmt.Sprintf(" (%d and %d characters given)", len(id), len(secret))
	default:
		hint = " (only lowercase letters and digits are allowed)"
	}
	v.fail(p, redacted, "must be a bootstrap token of the form <6 characters [a-z0-9]>.<16 characters [a-z0-9]>%s", hint)
}

// tokenID returns the public half of a well-formed bootstrap token.
func tokenID(s Secret) (string, bool) {
	m := tokenRE.FindStringSubmatch(s.Reveal())
	if m == nil {
		return "", false
	}
	return m[1], true
}

func (v *validator) release(r *Release) {
	p := []string{"kubernetes", "release"}
	if r.Mirror == "" {
		if r.CAFile != "" || r.CAPEM != "" {
			v.fail(append(p, "mirror"), "", "missing: a CA is set for the release mirror, but no mirror")
		}
		if len(r.KubeletSHA256) > 0 {
			v.fail(append(p, "mirror"), "", "missing: kubernetes.release.kubelet_sha256 pins the release mirror's kubelet, but there is no mirror")
		}
		return
	}
	v.sourceWithHelp(append(p, "mirror"), r.Mirror, releaseMirrorHelp)
	if u, err := url.Parse(r.Mirror); err == nil && (u.RawQuery != "" || u.Fragment != "") {
		v.fail(append(p, "mirror"), safeURL(r.Mirror), "must not have a query or fragment: paths are appended to it")
	}
	if strings.HasPrefix(r.Mirror, "http://") {
		// Whoever answers on the network would pick both the kubelet,
		// which runs as root, and the digest it is checked against.
		v.fail(append(p, "mirror"), safeURL(r.Mirror), "must be https (or an absolute local path): over plain http the network picks both the kubelet and its digest")
	}
	switch {
	case r.CAFile != "" && r.CAPEM != "":
		v.fail(append(p, "ca_pem"), "", "conflicts with kubernetes.release.ca_file: set ca_file or ca_pem, not both")
	case (r.CAFile != "" || r.CAPEM != "") && !strings.HasPrefix(r.Mirror, "https://"):
		v.fail(append(p, "ca_file"), "", "a CA applies to an https mirror only")
	case r.CAFile != "":
		v.absPath(append(p, "ca_file"), r.CAFile)
	case r.CAPEM != "":
		v.caPEM(append(p, "ca_pem"), r.CAPEM)
	}
	for _, ver := range SortedKeys(r.KubeletSHA256) {
		kp := append(slices.Clone(p), "kubelet_sha256", ver)
		if !versionRE.MatchString(ver) {
			v.fail(kp, quote(ver), `the key must be a Kubernetes release MAJOR.MINOR.PATCH, e.g. "1.37.2"`)
		}
		v.sha256(kp, r.KubeletSHA256[ver])
	}
}

func (v *validator) kubernetes(k *Kubernetes) {
	v.required([]string{"kubernetes", "version"}, k.Version, func(p []string, s string) {
		if !versionRE.MatchString(s) {
			v.fail(p, quote(s), `must be a Kubernetes release MAJOR.MINOR.PATCH, e.g. "1.37.2" (a leading "v" is allowed)`)
		}
	})
	for _, key := range slices.Sorted(maps.Keys(k.Labels)) {
		p := []string{"kubernetes", "labels", key}
		if msg := checkQualifiedName(key); msg != "" {
			v.fail(p, "", "label key %s", msg)
		} else if !KubeletMaySetLabel(key) {
			v.fail(p, "", "label key in the kubernetes.io or k8s.io namespace that the kubelet may not set on its own Node (allowed there: %s, and the namespaces %s); set it with kubectl after the node joins",
				strings.Join(KubeletLabels, ", "), strings.Join(KubeletLabelNamespaces, ", "))
		}
		if msg := checkLabelValue(k.Labels[key]); msg != "" {
			v.fail(p, quote(k.Labels[key]), "label value %s", msg)
		}
	}
	for i, t := range k.Taints {
		if _, err := ParseTaint(t); err != nil {
			v.fail(elem([]string{"kubernetes", "taints"}, i), quote(t), "%v", err)
		}
	}
	for i, s := range k.ClusterDNS {
		if a, err := netip.ParseAddr(s); err != nil || a.Zone() != "" {
			v.fail(elem([]string{"kubernetes", "cluster_dns"}, i), quote(s), "must be an IPv4 or IPv6 address")
		}
	}
	v.required([]string{"kubernetes", "cluster_domain"}, k.ClusterDomain, func(p []string, s string) {
		if !isDNSSubdomain(s) {
			v.fail(p, quote(s), "%s", dnsSubdomainHelp)
		}
	})
}

// checkQualifiedName checks a Kubernetes label or taint key: an optional
// DNS subdomain prefix and '/', then a name of at most 63 characters. It
// returns what is wrong, or "".
func checkQualifiedName(s string) string {
	prefix, name, hasPrefix := strings.Cut(s, "/")
	if !hasPrefix {
		name = s
	} else if prefix == "" || !isDNSSubdomain(prefix) {
		return fmt.Sprintf("%q: the prefix before '/' %s", s, dnsSubdomainHelp)
	}
	if name == "" || len(name) > 63 || !qualifiedRE.MatchString(name) {
		return fmt.Sprintf("%q must be [prefix/]name, the name at most 63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit", s)
	}
	return ""
}

// checkLabelValue returns what is wrong with a label value, or "".
func checkLabelValue(s string) string {
	if s != "" && (len(s) > 63 || !qualifiedRE.MatchString(s)) {
		return "must be empty or at most 63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
	}
	return ""
}

// TaintEffects are the effects a taint may have.
var TaintEffects = []string{"NoSchedule", "PreferNoSchedule", "NoExecute"}

// Taint is a parsed "key=value:Effect" or "key:Effect".
type Taint struct{ Key, Value, Effect string }

// ParseTaint parses and checks one taint in the kubelet's
// --register-with-taints syntax.
func ParseTaint(s string) (Taint, error) {
	rest, effect, found := cut(s, ":")
	if !found {
		return Taint{}, fmt.Errorf("must be key=value:Effect or key:Effect; the effect is missing (one of %s)", strings.Join(TaintEffects, ", "))
	}
	if !slices.Contains(TaintEffects, effect) {
		return Taint{}, fmt.Errorf("effect %q is not one of %s", effect, strings.Join(TaintEffects, ", "))
	}
	key, value, _ := strings.Cut(rest, "=")
	if msg := checkQualifiedName(key); msg != "" {
		return Taint{}, fmt.Errorf("taint key %s", msg)
	}
	if msg := checkLabelValue(value); msg != "" {
		return Taint{}, fmt.Errorf("taint value %q %s", value, msg)
	}
	return Taint{Key: key, Value: value, Effect: effect}, nil
}

// cut is strings.Cut at the last sep.
func cut(s, sep string) (before, after string, found bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}

func (v *validator) isolation(iso *Isolation) {
	if !slices.Contains(Modes, iso.Mode) {
		v.fail([]string{"isolation", "mode"}, quote(iso.Mode), "unknown isolation mode; known: %s", strings.Join(Modes, ", "))
	}
	p := []string{"isolation", "slots"}
	if len(iso.Slots) != 2 {
		v.fail(p, quoteList(iso.Slots), "must list exactly two slot names (%d given)", len(iso.Slots))
		return
	}
	for i, s := range iso.Slots {
		if !slotRE.MatchString(s) {
			v.fail(elem(p, i), quote(s), "slot name must be 1 to 16 characters of lowercase letters, digits and '-', starting with a letter and not ending with '-'")
		}
	}
	if iso.Slots[0] == iso.Slots[1] {
		v.fail(p, quoteList(iso.Slots), "the two slot names must differ")
	}
}

func quoteList(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = quote(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// stageBudget refuses timeouts whose worst case does not fit in a worker
// unit's own start timeout.
func (v *validator) stageBudget(t *Timeouts) {
	worst := t.Lock.Duration + t.Download.Duration + 2*(t.Stop.Duration+t.NodeReady.Duration)
	if worst > StageBudget && t.Download.Duration <= MaxTimeout && t.NodeReady.Duration <= MaxTimeout {
		v.fail([]string{"timeouts", "download"}, quote(t.Download.String()),
			"with the other timeouts the worst case of a repave, lock + download + 2 × (stop + node_ready) = %s, exceeds the %s a stage's unit allows (TimeoutStartSec=30min): lower timeouts.download or timeouts.node_ready",
			worst, StageBudget)
	}
}

func (v *validator) timeout(p []string, d time.Duration) {
	if d <= 0 || d > MaxTimeout {
		v.fail(p, quote(d.String()), "must be greater than 0 and at most %s", MaxTimeout)
	}
}
