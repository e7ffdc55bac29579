package hostile

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/kubeslot/kubeslot/lib/bundle"
	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// noBus is a --systemd-bus nobody answers on: it gets a stage past the
// start-up refusal to its own checks, and any dial fails naming it.
func (e *env) noBus() []string {
	return []string{"--systemd-bus", "unix:path=" + e.scratch + "/no-bus"}
}

// link plants a symbolic link at the host path p (inside the base) to target.
func (e *env) link(target string, elem ...string) string {
	e.t.Helper()
	p := filepath.Join(append([]string{e.prefix, "opt", "kubeslot"}, elem...)...)
	os.MkdirAll(filepath.Dir(p), 0o700)
	os.Remove(p)
	if err := os.Symlink(target, p); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// victim is a file outside the root prefix that a case must not change.
func (e *env) victim() string {
	e.t.Helper()
	return e.file("victim", "precious\n", 0o600)
}

func (e *env) victimIntact(p string) {
	e.t.Helper()
	b, err := os.ReadFile(p)
	fi, _ := os.Stat(p)
	if err != nil || string(b) != "precious\n" || fi.Mode().Perm() != 0o600 {
		e.t.Errorf("a file outside the root prefix changed: %q %v", b, err)
	}
}

// hostileContents are request or state file bodies no reader may trust.
var hostileContents = []struct{ name, body string }{
	{"not JSON", "{{{{"},
	{"empty", ""},
	{"JSON null", "null"},
	{"a JSON array", `[{"kind":"restart"}]`},
	{"an escape in the ID", `{"kind":"%s","id":"x\u001b]0;pwned\u0007"}`},
	{"2 MB of JSON", `{"kind":"%s","id":"` + strings.Repeat("a", 2<<20) + `"}`},
}

func stateCases() []hcase {
	var out []hcase
	// Request files of every kind, hostile in content or type: status shows
	// them without trusting them, never hangs, never prints raw escapes.
	for _, kind := range []string{"repave", "restart", "upgrade", "reset"} {
		for _, c := range hostileContents {
			kind, c := kind, c
			// status marks a pending request no worker can use (exit 0).
			out = append(out, hcase{name: "status " + kind + " request " + c.name, bin: "kubeslot", code: 0, want: []string{"Pending requests:  " + kind + ".json (unusable:"},
				setup: func(e *env) []string {
					e.installed()
					body := strings.Replace(c.body, "%s", kind, 1)
					e.hostFile(body, "requests", kind+".json")
					return []string{"status"}
				},
				check: noEscapes})
		}
	}
	for _, kind := range []string{"repave", "upgrade"} {
		kind := kind
		out = append(out,
			hcase{name: "status " + kind + " request FIFO", bin: "kubeslot", code: 0, want: []string{"Pending requests:  " + kind + ".json (unusable:", "not a regular file"},
				setup: func(e *env) []string {
					e.installed()
					e.fifo(filepath.Join(e.prefix, "opt/kubeslot/requests", kind+".json"))
					return []string{"status"}
				}},
			hcase{name: "status " + kind + " request a link out of the root", bin: "kubeslot", code: 0, want: []string{"Pending requests:  " + kind + ".json (unusable:", "not a regular file"},
				setup: func(e *env) []string {
					e.installed()
					e.link(e.victim(), "requests", kind+".json")
					return []string{"status"}
				}},
			hcase{name: "status claimed " + kind + " request a link", bin: "kubeslot", code: 0, want: []string{"claimed-" + kind + ".json (unusable", "not a regular file"},
				setup: func(e *env) []string {
					e.installed()
					e.link("/etc/shadow", "state", "claimed-"+kind+".json")
					return []string{"status"}
				}},
		)
	}

	// State files: the ownership record, the applied configurations, the
	// active pointer, the layout marker and the release links.
	stateFile := func(name, body string, code int, want []string, elem ...string) hcase {
		return hcase{name: "status " + name, bin: "kubeslot", code: code, want: want, check: noEscapes,
			setup: func(e *env) []string {
				e.installed()
				e.hostFile(body, elem...)
				return []string{"status"}
			}}
	}
	out = append(out,
		stateFile("ownership record of a future schema", `{"schemaVersion": 99}`, 1, []string{"ownership.json"}, "ownership.json"),
		stateFile("ownership record an array", `[]`, 1, []string{"ownership.json"}, "ownership.json"),
		stateFile("ownership record empty", ``, 1, []string{"ownership.json"}, "ownership.json"),
		stateFile("applied configuration not JSON", `{{`, 1, []string{"a.json"}, "applied", "a.json"),
		stateFile("applied configuration of another slot", `{"slot":"b","mode":"nspawn"}`, 1, []string{"a.json"}, "applied", "a.json"),
		stateFile("active slot unknown", "c\n", 1, []string{"active"}, "applied", "active"),
		stateFile("active slot climbing", "../../../etc/passwd\n", 1, []string{"active"}, "applied", "active"),
		stateFile("active slot with an escape", "a\x1b[2J\n", 1, []string{"active"}, "applied", "active"),
		stateFile("layout version zero", "0\n", 1, []string{"layout-version"}, "layout-version"),
		stateFile("layout version negative", "-1\n", 1, []string{"layout-version"}, "layout-version"),
		stateFile("layout version not a number", "one\n", 1, []string{"layout-version"}, "layout-version"),
		stateFile("layout version empty", "", 1, []string{"layout-version"}, "layout-version"),
		stateFile("layout version huge", strings.Repeat("9", 4096), 1, []string{"layout-version"}, "layout-version"),
		hcase{name: "status active pointer FIFO", bin: "kubeslot", code: 1, want: []string{"active", "not a regular file"},
			setup: func(e *env) []string {
				e.installed()
				p, _ := e.root.Path(hostroot.AppliedDir, "active")
				e.fifo(p)
				return []string{"status"}
			}},
		hcase{name: "status active pointer a link out of the root", bin: "kubeslot", code: 1, want: []string{"active"},
			setup: func(e *env) []string {
				e.installed()
				e.link(e.victim(), "applied", "active")
				return []string{"status"}
			}},
		hcase{name: "status applied configuration a link", bin: "kubeslot", code: 1, want: []string{"a.json", "not a regular file"},
			setup: func(e *env) []string {
				e.installed()
				e.link("/etc/shadow", "applied", "a.json")
				return []string{"status"}
			}},
		hcase{name: "status ownership record FIFO", bin: "kubeslot", code: 1, want: []string{"ownership.json", "not a regular file"},
			setup: func(e *env) []string {
				e.installed()
				p, _ := e.root.File(hostroot.OwnershipFile)
				e.fifo(p)
				return []string{"status"}
			}},
		hcase{name: "status ownership record huge", bin: "kubeslot", code: 1, want: []string{"ownership.json", "larger than allowed (16777216 bytes at most)"},
			setup: func(e *env) []string {
				e.installed()
				p, _ := e.root.File(hostroot.OwnershipFile)
				os.Truncate(p, 3<<30)
				return []string{"status"}
			}},
		hcase{name: "status layout marker a link", bin: "kubeslot", code: 1, want: []string{"layout-version", "not a regular file"},
			setup: func(e *env) []string {
				e.installed()
				e.link("/proc/self/environ", "layout-version")
				return []string{"status"}
			}},
		// status does not read the release links: safe, not an error.
		hcase{name: "status current release link climbing out", bin: "kubeslot", code: 0, want: []string{"Active slot:       a"},
			setup: func(e *env) []string {
				e.installed()
				e.link("../../../../../../etc", "current")
				return []string{"status"}
			}},
		hcase{name: "status current release link loop", bin: "kubeslot", code: 0, want: []string{"Active slot:       a"},
			setup: func(e *env) []string {
				e.installed()
				e.link("current", "current")
				return []string{"status"}
			}},
		hcase{name: "status request and claim files named with escapes", bin: "kubeslot", code: 0, want: []string{`\x1b]0;pwned`},
			check: noEscapes,
			setup: func(e *env) []string {
				e.installed()
				e.hostFile("{}", "requests", "x\x1b]0;pwned\x07.json")
				e.hostFile("{}", "state", "claimed-\x1b[2J.json")
				return []string{"status"}
			}},
		hcase{name: "status json of a damaged record", bin: "kubeslot", code: 1, want: []string{`"problems"`},
			setup: func(e *env) []string {
				e.installed()
				e.hostFile(`{"schemaVersion": 1, "jour`, "ownership.json")
				return []string{"status", "-o", "json"}
			}},
		hcase{name: "status of a base that is a file", bin: "kubeslot", code: 1, want: []string{"/opt/kubeslot"},
			setup: func(e *env) []string {
				os.MkdirAll(filepath.Join(e.prefix, "opt"), 0o755)
				os.WriteFile(filepath.Join(e.prefix, "opt", "kubeslot"), []byte("x"), 0o600)
				return []string{"status"}
			}},
	)
	return out
}

// noEscapes fails a case whose output carries a raw terminal escape.
func noEscapes(e *env, out string) {
	if strings.ContainsAny(out, "\x1b\x07") {
		e.t.Errorf("escape sequences reached the terminal: %q", out)
	}
}

// tgz builds a gzipped tar of entries (name, body, type) for bundle cases.
func tgz(entries ...*tar.Header) []byte {
	var b bytes.Buffer
	gz := gzip.NewWriter(&b)
	tw := tar.NewWriter(gz)
	for _, h := range entries {
		body := h.Linkname
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(body))
			h.Linkname = ""
		}
		tw.WriteHeader(h)
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(body))
		}
	}
	tw.Close()
	gz.Close()
	return b.Bytes()
}

// reg is a regular tar entry (the body is carried in Linkname until tgz).
func reg(name, body string) *tar.Header {
	return &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o755, Linkname: body}
}

// manifest lists every binary a bundle must hold, each holding binBody.
var manifest = func() string {
	sum := sha256.Sum256([]byte(binBody))
	var files []string
	for _, b := range bundle.Binaries {
		files = append(files, fmt.Sprintf(`{"path":%q,"sha256":"%x","size":%d,"mode":493}`, b, sum, len(binBody)))
	}
	return fmt.Sprintf(`{"version":"v9.9.9","arch":%q,"created":"2026-01-01T00:00:00Z","files":[%s]}`, runtime.GOARCH, strings.Join(files, ","))
}()

const binBody = "#!/bin/sh\n"

func bundleCases() []hcase {
	bundleCase := func(name string, data []byte, want ...string) hcase {
		return hcase{name: "upgrader preflight bundle " + name, bin: "kubeslot-upgrader", code: 1, want: want,
			setup: func(e *env) []string {
				e.installed()
				return []string{"--preflight", "--bundle", e.file("b.tar.gz", string(data), 0o600)}
			},
			check: func(e *env, out string) {
				if _, err := os.Lstat(filepath.Join(e.prefix, "etc", "evil")); err == nil {
					e.t.Error("a bundle entry was written outside the release directory")
				}
			}}
	}
	gzGarbage := func() []byte {
		var b bytes.Buffer
		gz := gzip.NewWriter(&b)
		gz.Write([]byte("not a tar at all"))
		gz.Close()
		return b.Bytes()
	}()
	whole := tgz(reg("manifest.json", manifest), reg("kubeslot-bootstrap", binBody))
	return []hcase{
		bundleCase("empty", nil, "b.tar.gz"),
		bundleCase("not gzip", []byte("PK\x03\x04 a zip"), "b.tar.gz"),
		bundleCase("gzip of garbage", gzGarbage, "b.tar.gz"),
		bundleCase("truncated", whole[:len(whole)/2], "b.tar.gz"),
		bundleCase("without a manifest", tgz(reg("kubeslot-bootstrap", binBody)), "manifest"),
		bundleCase("manifest not JSON", tgz(reg("manifest.json", "{{")), "manifest"),
		bundleCase("entry climbing out", tgz(reg("manifest.json", manifest), reg("../../etc/evil", "x")), "../../etc/evil"),
		bundleCase("absolute entry", tgz(reg("manifest.json", manifest), reg("/etc/evil", "x")), "/etc/evil"),
		bundleCase("symlink entry", tgz(reg("manifest.json", manifest), &tar.Header{Name: "kubeslot-bootstrap", Typeflag: tar.TypeSymlink, Linkname: "/etc/shadow"}), "kubeslot-bootstrap"),
		bundleCase("device entry", tgz(reg("manifest.json", manifest), &tar.Header{Name: "kubeslot-bootstrap", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}), "kubeslot-bootstrap"),
		{name: "upgrader preflight bundle a directory", bin: "kubeslot-upgrader", code: 1, want: []string{"not a regular file"},
			setup: func(e *env) []string {
				e.installed()
				return []string{"--preflight", "--bundle", e.scratch}
			}},
		{name: "upgrader preflight bundle with a bad sha256", bin: "kubeslot-upgrader", code: 2, want: []string{"sha256"},
			setup: func(e *env) []string {
				e.installed()
				return []string{"--preflight", "--bundle", e.file("b.tar.gz", string(whole), 0o600), "--sha256", "xyz"}
			}},
	}
}
