package oci

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// Resolved says which endpoint answered for an image and with what.
type Resolved struct {
	// Endpoint is the mirror URL, or "https://<registry>" for the registry
	// itself.
	Endpoint string
	// Digest is the manifest (or index) digest, "sha256:<hex>".
	Digest string
}

// ErrNotFound: every endpoint that answered said it has no such image (and
// none answered with it). ErrUnreachable: no endpoint answered at all.
var (
	ErrNotFound    = errors.New("no registry has this image")
	ErrUnreachable = errors.New("no registry could be reached")
)

// Resolve asks, as containerd does with a hosts.toml, each mirror URL in
// order and then the image's registry itself whether it has the image ref
// (a full reference with a tag or digest): a HEAD of its manifest,
// anonymous, bounded by ctx. A mirror's scheme is used as written (http is
// plain HTTP); the registry itself is asked over https (plain http only for
// a loopback registry, as containerd does). The error wraps ErrNotFound when
// an endpoint answered that it has no such image and none had it, else
// ErrUnreachable, and lists what each endpoint answered. rt nil means
// go-containerregistry's default transport.
func Resolve(ctx context.Context, ref string, mirrors []string, rt http.RoundTripper) (*Resolved, error) {
	r, err := name.ParseReference(ref, name.StrictValidation)
	if err != nil {
		return nil, err
	}
	if rt == nil {
		rt = remote.DefaultTransport
	}
	type endpoint struct {
		url string
		ref name.Reference
	}
	var eps []endpoint
	for _, m := range mirrors {
		u, err := url.Parse(m)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("mirror %q: not a URL", m)
		}
		var opts []name.Option
		if u.Scheme == "http" {
			opts = append(opts, name.Insecure)
		}
		mr, err := retarget(r, u.Host, opts...)
		if err != nil {
			return nil, fmt.Errorf("mirror %q: %w", m, err)
		}
		eps = append(eps, endpoint{strings.TrimSuffix(m, "/"), mr})
	}
	eps = append(eps, endpoint{"https://" + r.Context().RegistryStr(), r})

	var answers []string
	notFound := false
	for _, ep := range eps {
		desc, err := remote.Head(ep.ref, remote.WithContext(ctx), remote.WithAuth(authn.Anonymous),
			remote.WithTransport(rt), remote.WithUserAgent("kubeslot"))
		if err == nil {
			return &Resolved{Endpoint: ep.url, Digest: desc.Digest.String()}, nil
		}
		var te *transport.Error
		switch {
		case errors.As(err, &te) && te.StatusCode == http.StatusNotFound:
			notFound = true
			answers = append(answers, ep.url+": not found")
		case errors.As(err, &te) && (te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden):
			notFound = true // it answered; anonymous pulls (what containerd does without credentials) are refused
			answers = append(answers, fmt.Sprintf("%s: refused anonymous access (%d)", ep.url, te.StatusCode))
		case ctx.Err() != nil:
			answers = append(answers, ep.url+": no answer in time")
		default:
			answers = append(answers, fmt.Sprintf("%s: %v", ep.url, err))
		}
		if ctx.Err() != nil {
			break
		}
	}
	kind := ErrUnreachable
	if notFound {
		kind = ErrNotFound
	}
	return nil, fmt.Errorf("%w (%s)", kind, strings.Join(answers, "; "))
}

// retarget is r on another registry host (a mirror): same repository, same
// tag or digest.
func retarget(r name.Reference, host string, opts ...name.Option) (name.Reference, error) {
	reg, err := name.NewRegistry(host, opts...)
	if err != nil {
		return nil, err
	}
	repo := reg.Repo(r.Context().RepositoryStr())
	switch t := r.(type) {
	case name.Tag:
		return repo.Tag(t.TagStr()), nil
	case name.Digest:
		return repo.Digest(t.DigestStr()), nil
	}
	return nil, fmt.Errorf("reference %s: neither a tag nor a digest", r)
}
