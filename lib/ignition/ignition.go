// Package ignition builds Ignition configs: the JSON a Fedora CoreOS or
// Flatcar host reads on its first boot to write files and enable units
// before anything else runs. `kubeslot ignition` uses it to provision a host
// that bootstraps itself.
//
// It writes spec 3.3.0, the oldest spec with everything kubeslot needs
// (sha256 verification arrived in 3.1.0) that both Flatcar (since 3185.0.0)
// and Fedora CoreOS accept; every later 3.x Ignition reads it too. Only the
// subset kubeslot uses is modelled (files, directories, links, systemd
// units). Every config it writes passes Check, which is Ignition's own
// parser and validator for that spec (warnings refused too), so that a
// config refused at boot, when nobody is watching, is refused here instead.
//
// Imported by cmd/kubeslot only (a test keeps Ignition's package out of
// every other binary); it does not touch the host.
package ignition

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"path"
	"strings"

	"sigs.k8s.io/yaml"
)

// SpecVersion is the Ignition config spec this package writes.
const SpecVersion = "3.3.0"

// Config is an Ignition config (the subset kubeslot writes).
type Config struct {
	Ignition Ignition `json:"ignition"`
	Storage  Storage  `json:"storage,omitzero"`
	Systemd  Systemd  `json:"systemd,omitzero"`
}

// Ignition is the config's metadata, and the configs Ignition merges this
// one over (ignition.config.merge: each of them first, then this config).
type Ignition struct {
	Version string      `json:"version"`
	Config  *ConfigRefs `json:"config,omitempty"`
}

// ConfigRefs are the other configs a config names.
type ConfigRefs struct {
	Merge []Resource `json:"merge,omitempty"`
}

// Storage lists what Ignition writes into the host's filesystem.
type Storage struct {
	Directories []Directory `json:"directories,omitempty"`
	Files       []File      `json:"files,omitempty"`
	Links       []Link      `json:"links,omitempty"`
}

// Directory is a directory Ignition creates. Mode is decimal in JSON, as the
// spec requires; 0 leaves Ignition's default (0755).
type Directory struct {
	Path string `json:"path"`
	Mode int    `json:"mode,omitempty"`
}

// File is a file Ignition writes.
type File struct {
	Path     string   `json:"path"`
	Mode     int      `json:"mode,omitempty"`
	Contents Resource `json:"contents"`
}

// Resource says where a file's contents come from.
type Resource struct {
	// Source is a data: URL (contents inline) or an http(s) URL.
	Source string `json:"source"`
	// Compression is "gzip" or empty; a hash describes the uncompressed
	// contents.
	Compression  string       `json:"compression,omitempty"`
	Verification Verification `json:"verification,omitzero"`
}

// Verification makes Ignition refuse contents with another digest.
type Verification struct {
	// Hash is "sha256-<hex>" or "sha512-<hex>".
	Hash string `json:"hash,omitempty"`
}

// Link is a symbolic link Ignition creates.
type Link struct {
	Path   string `json:"path"`
	Target string `json:"target"`
}

// Systemd lists the units Ignition writes.
type Systemd struct {
	Units []Unit `json:"units,omitempty"`
}

// Unit is a systemd unit file Ignition writes into /etc/systemd/system.
type Unit struct {
	Name string `json:"name"`
	// Enabled nil leaves the unit's enablement alone.
	Enabled  *bool  `json:"enabled,omitempty"`
	Contents string `json:"contents,omitempty"`
}

// Source is where a file's contents come from: Inline or Remote.
type Source struct {
	res Resource
}

// inlineGzipMin is the size from which inline contents are compressed: a
// config is a few KiB and is easier to read back as plain base64, a binary
// is megabytes and shrinks by half or more.
const inlineGzipMin = 64 << 10

// Inline puts data into the config itself as a base64 data: URL (gzipped
// when that makes it smaller and it is large enough to matter). Anyone who
// can read the Ignition config can read data.
func Inline(data []byte) Source {
	if len(data) >= inlineGzipMin {
		var buf bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		_, _ = zw.Write(data) // writes to a bytes.Buffer do not fail
		_ = zw.Close()
		if buf.Len() < len(data) {
			return Source{Resource{Source: dataURL(buf.Bytes()), Compression: "gzip"}}
		}
	}
	return Source{Resource{Source: dataURL(data)}}
}

func dataURL(b []byte) string { return "data:;base64," + base64.StdEncoding.EncodeToString(b) }

// Remote has Ignition fetch the contents from an http(s) URL and refuse
// them unless their sha256 is sha256hex.
func Remote(rawURL, sha256hex string) (Source, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Source{}, fmt.Errorf("source %q: want an http or https URL", rawURL)
	}
	d := strings.ToLower(sha256hex)
	if b, err := hex.DecodeString(d); err != nil || len(b) != 32 {
		return Source{}, fmt.Errorf("sha256 %q for %s: want 64 hex digits", sha256hex, rawURL)
	}
	return Source{Resource{Source: u.String(), Verification: Verification{Hash: "sha256-" + d}}}, nil
}

// Builder assembles a Config, refusing what Ignition would refuse at boot
// as each node is added, so the error names the caller's input: relative or
// duplicate paths, modes with bits Ignition does not support, a path that
// goes through a link of the config, a file or link used as a parent
// directory, unit names without a unit type. JSON then checks the whole
// config with Check. The rules Ignition's validation lacks (see Check) live
// only here.
type Builder struct {
	cfg   Config
	nodes map[string]string // path -> "file", "directory" or "link"
	units map[string]bool
}

// NewBuilder returns an empty config for SpecVersion.
func NewBuilder() *Builder {
	return &Builder{
		cfg:   Config{Ignition: Ignition{Version: SpecVersion}},
		nodes: map[string]string{},
		units: map[string]bool{},
	}
}

// Directory adds a directory with mode (permission bits only).
func (b *Builder) Directory(p string, mode fs.FileMode) error {
	if err := b.addNode(p, "directory", mode); err != nil {
		return err
	}
	b.cfg.Storage.Directories = append(b.cfg.Storage.Directories, Directory{Path: p, Mode: int(mode)})
	return nil
}

// File adds a file with mode (permission bits only) and contents from src.
func (b *Builder) File(p string, mode fs.FileMode, src Source) error {
	if src.res.Source == "" {
		return fmt.Errorf("ignition: file %s: no contents source", p)
	}
	if err := b.addNode(p, "file", mode); err != nil {
		return err
	}
	b.cfg.Storage.Files = append(b.cfg.Storage.Files, File{Path: p, Mode: int(mode), Contents: src.res})
	return nil
}

// Link adds a symbolic link at p pointing to target (relative targets are
// resolved from p's directory, as usual).
func (b *Builder) Link(p, target string) error {
	if target == "" || strings.ContainsRune(target, 0) {
		return fmt.Errorf("ignition: link %s: empty or invalid target %q", p, target)
	}
	if err := b.addNode(p, "link", 0); err != nil {
		return err
	}
	b.cfg.Storage.Links = append(b.cfg.Storage.Links, Link{Path: p, Target: target})
	return nil
}

// unitTypes are the suffixes systemd gives unit names.
var unitTypes = []string{".service", ".socket", ".device", ".mount", ".automount", ".swap", ".target", ".path", ".timer", ".slice", ".scope"}

// Unit adds a unit file; enabled means Ignition enables it (it needs an
// [Install] section for that to do anything).
func (b *Builder) Unit(name string, contents []byte, enabled bool) error {
	if !validUnitName(name) {
		return fmt.Errorf("ignition: unit name %q: want NAME.TYPE, TYPE one of %s", name, strings.Join(unitTypes, " "))
	}
	if b.units[name] {
		return fmt.Errorf("ignition: unit %s added twice", name)
	}
	if len(bytes.TrimSpace(contents)) == 0 {
		return fmt.Errorf("ignition: unit %s: empty contents", name)
	}
	b.units[name] = true
	b.cfg.Systemd.Units = append(b.cfg.Systemd.Units, Unit{Name: name, Enabled: &enabled, Contents: string(contents)})
	return nil
}

func validUnitName(name string) bool {
	if name == "" || strings.ContainsAny(name, "/\x00 ") {
		return false
	}
	for _, t := range unitTypes {
		if strings.HasSuffix(name, t) && len(name) > len(t) {
			return true
		}
	}
	return false
}

func (b *Builder) addNode(p, kind string, mode fs.FileMode) error {
	if !path.IsAbs(p) || path.Clean(p) != p || p == "/" {
		return fmt.Errorf("ignition: %s path %q: want a clean absolute path below /", kind, p)
	}
	if mode&^fs.ModePerm != 0 {
		return fmt.Errorf("ignition: %s %s: mode %#o: only permission bits (no setuid, setgid, sticky) are supported", kind, p, uint32(mode))
	}
	if other, ok := b.nodes[p]; ok {
		return fmt.Errorf("ignition: %s %s: the path is already a %s of this config", kind, p, other)
	}
	for q, qkind := range b.nodes {
		if under(p, q) && qkind != "directory" {
			return fmt.Errorf("ignition: %s %s: it is under %s, a %s of this config", kind, p, q, qkind)
		}
		if under(q, p) && kind != "directory" {
			return fmt.Errorf("ignition: %s %s: %s (a %s of this config) is under it", kind, p, q, qkind)
		}
	}
	b.nodes[p] = kind
	return nil
}

// under reports whether p is strictly below dir.
func under(p, dir string) bool { return strings.HasPrefix(p, dir+"/") }

// JSON returns the config as indented JSON, checked with Check (Ignition's
// own validation).
func (b *Builder) JSON() ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // unit files hold '<', '>' and '&' legitimately
	enc.SetIndent("", "  ")
	if err := enc.Encode(b.cfg); err != nil {
		return nil, err
	}
	if err := Check(buf.Bytes()); err != nil {
		return nil, errors.Join(errors.New("ignition: built config does not pass the check (a bug)"), err)
	}
	return buf.Bytes(), nil
}

// Merge has Ignition merge the operator's own config (spec 3.3.0, checked
// with Check first) with this one: it goes into ignition.config.merge as an
// inline resource, so Ignition's own merge rules apply (a file or unit both
// name is this config's). One host config carries both, no second fetch.
func (b *Builder) Merge(config []byte) error {
	if err := Check(config); err != nil {
		return fmt.Errorf("the config to merge: %w", err)
	}
	if b.cfg.Ignition.Config == nil {
		b.cfg.Ignition.Config = &ConfigRefs{}
	}
	b.cfg.Ignition.Config.Merge = append(b.cfg.Ignition.Config.Merge, Inline(config).res)
	return nil
}

// ButaneVariants are the Butane variants Butane can write from this
// package's configs, with the Butane spec version that gives Ignition
// SpecVersion.
var ButaneVariants = map[string]string{"fcos": "1.4.0", "flatcar": "1.0.0"}

// Butane returns the config as a Butane document of variant (fcos or
// flatcar): the same storage and systemd sections (Butane's schema is
// Ignition's there), to merge into the operator's own Butane file and
// translate with the rest of it. The config is checked first, as by JSON.
func (b *Builder) Butane(variant string) ([]byte, error) {
	version, ok := ButaneVariants[variant]
	if !ok {
		return nil, fmt.Errorf("butane variant %q: want fcos or flatcar", variant)
	}
	data, err := b.JSON()
	if err != nil {
		return nil, err
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	ign, _ := doc["ignition"].(map[string]any)
	delete(ign, "version")
	if len(ign) == 0 {
		delete(doc, "ignition")
	}
	doc["variant"], doc["version"] = variant, version
	out, err := yaml.Marshal(doc)
	if err != nil {
		return nil, err
	}
	return append([]byte("# Butane ("+variant+" "+version+") from kubeslot ignition\n"), out...), nil
}
