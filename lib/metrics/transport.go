package metrics

import (
	"net/http"
	"strconv"
	"strings"
)

// WrapTransport returns rt counting the API errors of every request that
// goes through it (NameAPIErrors). It sits in the rest.Config the watcher's
// clients are built from (rest.Config.Wrap), so the informers' lists and
// watches, the status writes, Events and rollout leases are all counted at
// one place. A request whose context ended (the watcher stopping, a watch
// it closed) is not an error of the API and is not counted.
func (w *Watcher) WrapTransport(rt http.RoundTripper) http.RoundTripper {
	if w == nil {
		return rt
	}
	return &countingTransport{next: rt, w: w}
}

type countingTransport struct {
	next http.RoundTripper
	w    *Watcher
}

func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	code := ""
	switch {
	case err != nil:
		if req.Context().Err() != nil {
			return resp, err
		}
		code = "transport"
	case resp.StatusCode >= 400:
		code = strconv.Itoa(resp.StatusCode)
	}
	if code != "" {
		t.w.apiErrors.WithLabelValues(verbOf(req), resourceOf(req.URL.Path), code).Inc()
	}
	return resp, err
}

// verbOf is the request's HTTP method in lower case, or "watch" for a
// watch (a GET with watch=true or watch=1).
func verbOf(req *http.Request) string {
	if req.Method == http.MethodGet {
		if v := req.URL.Query().Get("watch"); v == "true" || v == "1" {
			return "watch"
		}
	}
	switch req.Method {
	case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return strings.ToLower(req.Method)
	}
	return "other"
}

// resourceOf is the API resource a path names, with its subresource
// ("machines/status"): /api/v1/<r>/..., /apis/<group>/<version>/<r>/...,
// either with namespaces/<ns>/ before <r>. Anything else is "other", so the
// label's values stay the few resources the watcher uses (never a name).
func resourceOf(path string) string {
	seg := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(seg) >= 3 && seg[0] == "api":
		seg = seg[2:]
	case len(seg) >= 4 && seg[0] == "apis":
		seg = seg[3:]
	default:
		return "other"
	}
	if len(seg) >= 3 && seg[0] == "namespaces" {
		seg = seg[2:]
	}
	r := seg[0]
	if len(seg) >= 3 {
		r += "/" + seg[2]
	}
	if !labelSafe(r) {
		return "other"
	}
	return r
}

// labelSafe: lower-case resource names only, bounded.
func labelSafe(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '/' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}
