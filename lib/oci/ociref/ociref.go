// Package ociref parses the OCI image form of a rootfs source,
// "oci://<registry>/<repository>[:<tag>][@sha256:<hex>]", and decides which
// registries may be reached without TLS. It is separate from lib/oci so
// that lib/config can validate a source without linking the registry
// client. Imported by whatever names or checks an image source: lib/config,
// lib/oci, lib/slot (the sandbox image) and the nspawn backend.
package ociref

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// Scheme prefixes an OCI image source.
const Scheme = "oci://"

// Help describes the accepted form, for error messages.
const Help = `an OCI image source is "oci://<registry host>/<repository>[:<tag>]"; its sha256 is the image manifest digest (or an index's digest), which governs what is pulled`

// Is reports whether source is an OCI image source (of any validity).
func Is(source string) bool { return strings.HasPrefix(source, Scheme) }

// Ref is a parsed OCI image source pinned to a digest.
type Ref struct {
	// Digest is repository@sha256:<hex>: what is pulled. A tag written in
	// the source does not take part in the pull.
	Digest name.Digest
	// Tag is the tag written in the source, or "".
	Tag string
	// Loopback says the registry is on this host: the only kind that may
	// be reached over plain http.
	Loopback bool
}

// String is the pinned reference, fit for logs (it holds no secret).
func (r Ref) String() string { return r.Digest.String() }

// Parse checks source and pins it to sha256hex (64 hex digits). A digest
// written in source must equal sha256hex. sha256hex may be empty to check
// the source's form only. Error messages never repeat the source.
func Parse(source, sha256hex string) (Ref, error) {
	raw, ok := strings.CutPrefix(source, Scheme)
	if !ok {
		return Ref{}, fmt.Errorf("does not start with %q", Scheme)
	}
	if at := strings.Index(raw, "@"); at >= 0 && (strings.Count(raw, "@") > 1 || !strings.HasPrefix(raw[at:], "@sha256:")) {
		return Ref{}, errors.New("must not contain credentials ('@' may only introduce a sha256 digest); registry credentials are not supported, pulls are anonymous")
	}
	if strings.ContainsAny(raw, "?#") || strings.HasSuffix(raw, "/") {
		return Ref{}, errors.New("is not an image reference: " + Help)
	}
	first, _, found := strings.Cut(raw, "/")
	if !found || !(strings.ContainsAny(first, ".:") || first == "localhost") {
		// Without this, "debian" would mean Docker Hub: name the registry.
		return Ref{}, errors.New("must name its registry host, e.g. \"oci://registry.example/node/bookworm\"")
	}
	parsed, err := name.ParseReference(raw)
	if err != nil {
		return Ref{}, fmt.Errorf("is not an image reference (%v): %s", err, Help)
	}
	repo := parsed.Context()
	loopback := IsLoopback(hostOnly(repo.RegistryStr()))
	var written string // digest hex written in the source
	if d, ok := parsed.(name.Digest); ok {
		written = strings.TrimPrefix(d.DigestStr(), "sha256:")
	}
	// The tag as written (name adds "latest" when there is none).
	var tag string
	before, _, _ := strings.Cut(raw, "@")
	if _, t, ok := strings.Cut(before[strings.LastIndex(before, "/")+1:], ":"); ok {
		tag = t
	}
	if sha256hex == "" {
		return Ref{Tag: tag, Loopback: loopback}, nil
	}
	want := strings.ToLower(sha256hex)
	if written != "" && written != want {
		return Ref{}, fmt.Errorf("names digest sha256:%s but the configured sha256 is %s: they must agree (or leave the digest out of the source)", written, want)
	}
	var opts []name.Option
	if loopback {
		opts = append(opts, name.Insecure)
	}
	d, err := name.NewDigest(repo.Name()+"@sha256:"+want, opts...)
	if err != nil {
		return Ref{}, fmt.Errorf("sha256 %q: %v", sha256hex, err)
	}
	return Ref{Digest: d, Tag: tag, Loopback: loopback}, nil
}

// IsLoopback reports whether host (without a port) is this machine:
// "localhost" or a loopback address.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(strings.Trim(host, "[]"))
	return err == nil && a.IsLoopback()
}

func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}
