package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/pelletier/go-toml/v2"
)

// Config is kubeslot's bootstrap configuration. The toml tags are the keys
// of the file; the json tags are the keys of the applied copy kubeslot
// persists. Optional fields are omitted from JSON when empty, so adding a new
// optional setting in a later release does not change the Fingerprint of
// configurations that do not use it.
type Config struct {
	Machine    Machine    `toml:"machine" json:"machine"`
	Cluster    Cluster    `toml:"cluster" json:"cluster"`
	Kubernetes Kubernetes `toml:"kubernetes" json:"kubernetes"`
	RootFS     RootFS     `toml:"rootfs" json:"rootfs"`
	Artifacts  Artifacts  `toml:"artifacts" json:"artifacts"`
	Isolation  Isolation  `toml:"isolation" json:"isolation"`
	Timeouts   Timeouts   `toml:"timeouts" json:"timeouts"`
	Host       Host       `toml:"host" json:"host"`
	Node       Node       `toml:"node" json:"node,omitzero"`
	// Metrics is the watcher's endpoint: an agent setting, neither applied
	// nor fingerprinted (see Metrics).
	Metrics Metrics `toml:"metrics" json:"-"`
	// Upgrade is what the upgrader trusts: an agent setting, neither
	// applied nor fingerprinted (see Upgrade).
	Upgrade Upgrade `toml:"upgrade" json:"-"`
}

// Machine names this host's node.
type Machine struct {
	// Name is the nspawn machine name: a DNS-1123 label.
	Name string `toml:"name" json:"name"`
	// NodeName is the Kubernetes node name (default: Name): a DNS-1123
	// subdomain, so FQDN-style node names work.
	NodeName string `toml:"node_name" json:"node_name"`
}

// Cluster says how to reach and join the control plane. Exactly one of
// CAFile/CAPEM and exactly one of BootstrapToken/Kubeconfig is set.
type Cluster struct {
	Server         string `toml:"server" json:"server"`
	CAFile         string `toml:"ca_file" json:"ca_file,omitempty"`
	CAPEM          string `toml:"ca_pem" json:"ca_pem,omitempty"`
	BootstrapToken Secret `toml:"bootstrap_token" json:"bootstrap_token,omitempty"`
	Kubeconfig     string `toml:"kubeconfig" json:"kubeconfig,omitempty"`
}

// Kubernetes configures the kubelet of the node.
type Kubernetes struct {
	// Version is MAJOR.MINOR.PATCH without a leading "v".
	Version string            `toml:"version" json:"version"`
	Labels  map[string]string `toml:"labels" json:"labels,omitempty"`
	// Taints are "key=value:Effect" or "key:Effect" (see ParseTaint).
	Taints        []string `toml:"taints" json:"taints,omitempty"`
	ClusterDNS    []string `toml:"cluster_dns" json:"cluster_dns,omitempty"`
	ClusterDomain string   `toml:"cluster_domain" json:"cluster_domain"`
	// Release is where the kubelet of Version is found when
	// artifacts.kubelet is not set.
	Release Release `toml:"release" json:"release,omitzero"`
}

// Release is a Kubernetes release mirror: a tree laid out like the upstream
// downloads, <mirror>/v<version>/bin/linux/<arch>/kubelet with the file's
// sha256 in kubelet.sha256 beside it (lib/kuberelease). An air-gapped copy
// of that tree works the same way.
type Release struct {
	// Mirror is an https base URL or an absolute path, e.g.
	// "https://dl.k8s.io/release". Plain http is refused: whoever answers
	// on the network would pick both the kubelet and its digest.
	Mirror string `toml:"mirror" json:"mirror,omitempty"`
	// CAFile or CAPEM (at most one) is the CA that signs an https mirror's
	// certificate, when the system's roots do not.
	CAFile string `toml:"ca_file" json:"ca_file,omitempty"`
	CAPEM  string `toml:"ca_pem" json:"ca_pem,omitempty"`
	// KubeletSHA256 pins the kubelet's digest per Kubernetes version
	// ("1.37.2" = "<64 hex digits>"): the mirror's own kubelet.sha256 then
	// has to agree with it, and is not trusted alone. Per version because a
	// Machine's spec changes the version without this file changing, so an
	// operator can pin the releases a node may move to ahead of time.
	KubeletSHA256 map[string]string `toml:"kubelet_sha256" json:"kubelet_sha256,omitempty"`
}

// RootFS is the node root filesystem image installed into a slot.
type RootFS struct {
	// Source is an http(s) URL or an absolute local path of a tarball, or
	// an OCI image "oci://<registry>/<repository>[:<tag>]" (lib/oci).
	Source string `toml:"source" json:"source"`
	// SHA256 is 64 lowercase hex digits: the tarball's digest, or for an
	// OCI image its manifest (or index) digest, which is what is pulled.
	SHA256 string `toml:"sha256" json:"sha256"`
}

// Artifact is one downloadable binary or archive.
type Artifact struct {
	// URL is an http(s) URL or an absolute local path.
	URL string `toml:"url" json:"url"`
	// SHA256 is 64 lowercase hex digits.
	SHA256 string `toml:"sha256" json:"sha256"`
}

// Artifacts lists what is installed on top of the rootfs. Only the kubelet
// is required, and only when kubernetes.release names no mirror: a node
// rootfs may already carry containerd, runc and the CNI plugins, and a nil
// entry means "use what the rootfs has".
type Artifacts struct {
	Kubelet Artifact `toml:"kubelet" json:"kubelet,omitzero"`
	// KubeletPinned is the kubelet found on the release mirror for
	// kubernetes.version (lib/kuberelease.Pin), recorded so that a resumed
	// or repeated build installs the same file. It is not a setting: no
	// file sets it, and Fingerprint leaves it out.
	KubeletPinned *Artifact `toml:"-" json:"kubelet_pinned,omitempty"`
	Containerd    *Artifact `toml:"containerd" json:"containerd,omitempty"`
	Runc          *Artifact `toml:"runc" json:"runc,omitempty"`
	CNIPlugins    *Artifact `toml:"cni_plugins" json:"cni_plugins,omitempty"`
}

// Isolation chooses how the node runs on the host.
type Isolation struct {
	// Mode is one of Modes; "" means DefaultMode.
	Mode string `toml:"mode" json:"mode"`
	// Slots are the two A/B slot names.
	Slots []string `toml:"slots" json:"slots"`
}

// Timeouts bound the waits of the bootstrap stages.
type Timeouts struct {
	Download  Duration `toml:"download" json:"download"`
	NodeReady Duration `toml:"node_ready" json:"node_ready"`
	Lock      Duration `toml:"lock" json:"lock"`
	Stop      Duration `toml:"stop" json:"stop"`
}

// Host holds what bootstrap may change on the host itself.
type Host struct {
	// InstallPackages allows bootstrap to install missing packages with apt-get
	// or dnf (lib/hostprep; never on image-based hosts).
	InstallPackages bool `toml:"install_packages" json:"install_packages,omitempty"`
}

// Duration is a time.Duration written as a string ("90s", "5m", "1h30m") in
// both TOML and JSON.
type Duration struct{ time.Duration }

// UnmarshalText parses a Go duration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("invalid duration %q: %s", b, durationHelp)
	}
	d.Duration = v
	return nil
}

// MarshalText writes the duration the way UnmarshalText reads it.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.Duration.String()), nil }

const durationHelp = `want a number with a unit, e.g. "90s", "5m" or "1h30m"`

// Defaults. Modes is the accepted set of isolation modes: a new mode is one
// more entry here (and its implementation elsewhere).
var Modes = []string{"nspawn"}

const (
	DefaultMode          = "nspawn"
	DefaultClusterDomain = "cluster.local"
	DefaultDownload      = 10 * time.Minute
	DefaultNodeReady     = 5 * time.Minute
	DefaultLock          = 30 * time.Second
	DefaultStop          = 90 * time.Second
	// MaxTimeout bounds every timeout: a typo like "500h" should not make a
	// stage wait for weeks.
	MaxTimeout = 24 * time.Hour
	// StageBudget is what one run of a worker stage may wait in all: its
	// unit's TimeoutStartSec (30 min, units/) less a margin. A repave's worst
	// case, lock + download + 2 × (stop + node_ready) (a failed verify rolls
	// back), must fit, or systemd would stop it half-way every time.
	StageBudget = 28 * time.Minute
)

// DefaultSlots returns the default slot names (a fresh slice each call).
func DefaultSlots() []string { return []string{"a", "b"} }

// MaxFileSize bounds Load: a config is a few KiB, and reading /dev/zero by
// mistake should fail, not exhaust memory.
const MaxFileSize = 1 << 20

// Load reads and parses the configuration file at path.
func Load(path string) (*Config, error) {
	// A FIFO or a device in place of the file is refused, not waited on.
	f, err := hostroot.OpenInput(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read config %s: %w", path, err)
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("read config %s: larger than %d bytes; is this the right file?", path, MaxFileSize)
	}
	return Parse(path, data)
}

// NameFromHost gives a configuration without [machine] name the host's: the
// first label of hostname, lower-cased, which must be a DNS-1123 label, and
// node_name the same. So one file (one Ignition config, one cloud-init
// file) serves a fleet. A name set in the file is kept.
func (c *Config) NameFromHost(hostname string) error {
	if c.Machine.Name != "" {
		return nil
	}
	name, _, _ := strings.Cut(strings.ToLower(strings.TrimSpace(hostname)), ".")
	if !isDNSLabel(name) {
		return &Error{Key: "machine.name", Msg: fmt.Sprintf("not set, and the host's name %q gives no machine name (%s): set machine.name", hostname, dnsLabelHelp)}
	}
	c.Machine.Name, c.Machine.NodeName = name, name
	return nil
}

// LoadForStage is Load for a stage binary that reads a configuration before
// it changes anything (the bootstrap, the repaver's --config): an invalid
// one is an error saying that nothing was changed on the host (exit 1),
// naming the field. A file without [machine] name gets this host's
// (NameFromHost, the kernel's hostname).
func LoadForStage(path string) (*Config, error) {
	cfg, err := Load(path)
	if err == nil {
		err = cfg.NameFromHost(hostname())
	}
	if err != nil {
		return nil, fmt.Errorf("invalid configuration, nothing was changed on the host: %w", err)
	}
	return cfg, nil
}

// hostname is the kernel's hostname ("" when it cannot be read); tests
// replace it.
var hostname = func() string {
	h, _ := os.Hostname()
	return h
}

// Hostname is the name NameFromHost is given on this host: what the
// stages and `kubeslot verify` use for a file without [machine] name.
func Hostname() string { return hostname() }

// Parse decodes data (the contents of file, which is only used in messages)
// strictly, applies defaults and validates. On failure it returns nil and an
// Errors value listing every problem found; a malformed document or a value
// of the wrong type stops decoding, so those come alone.
func Parse(file string, data []byte) (*Config, error) {
	idx := buildIndex(data)
	// An integer given for a duration would reach Duration.UnmarshalText
	// through a path where the library attaches no position; catch it first.
	if errs := checkTextKinds(idx); len(errs) > 0 {
		return nil, errs.locate(file, idx)
	}

	var cfg Config
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var errs Errors
	if err := dec.Decode(&cfg); err != nil {
		var strict *toml.StrictMissingError
		if !errors.As(err, &strict) {
			// Syntax and type errors: the decoded value is incomplete, so
			// validating it would only add noise.
			return nil, Errors{decodeError(err, idx)}.locate(file, idx)
		}
		// Unknown keys: the rest decoded fine, and a "missing" error next
		// to an "unknown key" error often shows the typo, so go on.
		for i := range strict.Errors {
			errs = append(errs, unknownKeyError(&strict.Errors[i]))
		}
	}
	errs = append(errs, explicitZeros(&cfg, idx)...)
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err.(Errors)...)
	}
	if len(errs) > 0 {
		return nil, errs.locate(file, idx)
	}
	return &cfg, nil
}

// explicitZeros reports settings written in the file as zero or empty where
// that value would otherwise silently become the default.
func explicitZeros(c *Config, idx index) Errors {
	var errs Errors
	for _, t := range c.timeouts() {
		if _, ok := idx.lookup(t.path); ok && t.d.Duration == 0 {
			errs = append(errs, newError(t.path, quote(t.d.String()), "must be greater than 0; omit the key for the default (%s)", t.def))
		}
	}
	if _, ok := idx.lookup(pathMachineName); ok && c.Machine.Name == "" {
		errs = append(errs, newError(pathMachineName, `""`, "must not be empty; omit the key for the host's own name"))
	}
	if _, ok := idx.lookup(pathSlots); ok && len(c.Isolation.Slots) == 0 {
		errs = append(errs, newError(pathSlots, "[]", "must list exactly two slot names; omit the key for the default [\"a\", \"b\"]"))
	}
	return errs
}

var (
	pathSlots       = []string{"isolation", "slots"}
	pathMachineName = []string{"machine", "name"}
)

type timeoutField struct {
	path []string
	d    *Duration
	def  time.Duration
}

func (c *Config) timeouts() []timeoutField {
	return []timeoutField{
		{[]string{"timeouts", "download"}, &c.Timeouts.Download, DefaultDownload},
		{[]string{"timeouts", "node_ready"}, &c.Timeouts.NodeReady, DefaultNodeReady},
		{[]string{"timeouts", "lock"}, &c.Timeouts.Lock, DefaultLock},
		{[]string{"timeouts", "stop"}, &c.Timeouts.Stop, DefaultStop},
	}
}

// ApplyDefaults fills unset fields with their defaults and normalises
// spellings that mean the same thing ("v1.37.2" becomes "1.37.2", an
// uppercase sha256 becomes lowercase), so that Fingerprint sees one form.
// Values that are invalid anyway are left as written, for the error message.
func (c *Config) ApplyDefaults() {
	if c.Machine.NodeName == "" {
		c.Machine.NodeName = c.Machine.Name
	}
	if c.Kubernetes.ClusterDomain == "" {
		c.Kubernetes.ClusterDomain = DefaultClusterDomain
	}
	if v := c.Kubernetes.Version; len(v) > 1 && v[0] == 'v' && versionRE.MatchString(v[1:]) {
		c.Kubernetes.Version = v[1:]
	}
	if c.Isolation.Mode == "" {
		c.Isolation.Mode = DefaultMode
	}
	if len(c.Isolation.Slots) == 0 {
		c.Isolation.Slots = DefaultSlots()
	}
	for _, t := range c.timeouts() {
		if t.d.Duration == 0 {
			t.d.Duration = t.def
		}
	}
	for _, a := range c.artifacts() {
		if a.a != nil {
			a.a.SHA256 = normalSHA256(a.a.SHA256)
		}
	}
	c.RootFS.SHA256 = normalSHA256(c.RootFS.SHA256)
	if len(c.Node.Kubelet.Config) == 0 {
		c.Node.Kubelet.Config = nil // an empty override is none
	}
	if pins := c.Kubernetes.Release.KubeletSHA256; len(pins) > 0 {
		norm := make(map[string]string, len(pins))
		for v, sum := range pins {
			if len(v) > 1 && v[0] == 'v' && versionRE.MatchString(v[1:]) {
				v = v[1:]
			}
			norm[v] = normalSHA256(sum)
		}
		c.Kubernetes.Release.KubeletSHA256 = norm
	}
}

type artifactField struct {
	name string
	a    *Artifact // nil when absent
}

func (c *Config) artifacts() []artifactField {
	kubelet := &c.Artifacts.Kubelet
	if *kubelet == (Artifact{}) && c.Kubernetes.Release.Mirror != "" {
		kubelet = nil // found on the release mirror
	}
	return []artifactField{
		{"kubelet", kubelet},
		{"containerd", c.Artifacts.Containerd},
		{"runc", c.Artifacts.Runc},
		{"cni_plugins", c.Artifacts.CNIPlugins},
	}
}

// Digests lists the sha256 of everything this configuration downloads into
// the artifact cache (rootfs, artifacts, preloaded images): what a cache
// prune must keep while the configuration is applied or requested.
func (c *Config) Digests() []string {
	out := []string{c.RootFS.SHA256}
	for _, a := range c.artifacts() {
		if a.a != nil && a.a.SHA256 != "" {
			out = append(out, a.a.SHA256)
		}
	}
	if p := c.Artifacts.KubeletPinned; p != nil && p.SHA256 != "" {
		out = append(out, p.SHA256)
	}
	for _, p := range c.Node.PreloadImages {
		out = append(out, p.SHA256)
	}
	return out
}

// KubeletArtifact is what a slot installs as the kubelet: artifacts.kubelet
// when it is set, else the one pinned from the release mirror.
func (c *Config) KubeletArtifact() (Artifact, error) {
	switch {
	case c.Artifacts.Kubelet.URL != "":
		return c.Artifacts.Kubelet, nil
	case c.Artifacts.KubeletPinned != nil:
		return *c.Artifacts.KubeletPinned, nil
	case c.Kubernetes.Release.Mirror != "":
		return Artifact{}, fmt.Errorf("kubelet %s not yet looked up on the release mirror (kubernetes.release.mirror)", c.Kubernetes.Version)
	}
	return Artifact{}, errors.New("no kubelet: set artifacts.kubelet or kubernetes.release.mirror")
}

// Summary is one line for people: what this configuration installs.
func (c *Config) Summary() string {
	sha := c.RootFS.SHA256
	if len(sha) > 12 {
		sha = sha[:12]
	}
	return fmt.Sprintf("machine %s, node %s, kubernetes %s, isolation %s, rootfs sha256:%s",
		c.Machine.Name, c.Machine.NodeName, c.Kubernetes.Version, c.Isolation.Mode, sha)
}

// LogValue makes a Config safe to log: a few identifying fields and the
// fingerprint, never the token. It has a value receiver so that both Config
// and *Config resolve through it.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("machine", c.Machine.Name),
		slog.String("node", c.Machine.NodeName),
		slog.String("kubernetes", c.Kubernetes.Version),
		slog.String("isolation", c.Isolation.Mode),
		slog.Attr{Key: "cluster", Value: c.Cluster.LogValue()},
		slog.String("rootfs_sha256", c.RootFS.SHA256),
		slog.String("fingerprint", c.Fingerprint()),
	)
}

// LogValue makes a Cluster safe to log: where it points and which kind of
// credential it uses. The bootstrap token's id (the public half, which
// Kubernetes also shows in the token Secret's name) is included when the
// token is well formed; the secret half never is.
func (cl Cluster) LogValue() slog.Value {
	ca := "none"
	switch {
	case cl.CAFile != "":
		ca = "file " + cl.CAFile
	case cl.CAPEM != "":
		ca = "inline PEM"
	}
	cred := "none"
	switch {
	case cl.BootstrapToken != "":
		cred = "bootstrap token"
		if id, ok := tokenID(cl.BootstrapToken); ok {
			cred += " " + id
		}
	case cl.Kubeconfig != "":
		cred = "kubeconfig " + cl.Kubeconfig
	}
	return slog.GroupValue(
		slog.String("server", cl.Server),
		slog.String("ca", ca),
		slog.String("credential", cred),
	)
}
