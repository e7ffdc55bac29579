// Package units holds kubeslot's systemd unit files, embedded in the
// binaries that install them (the bootstrap, the upgrader, `kubeslot
// ignition`), and renders them for one host.
//
// The files in this directory are templates with one token, @BASE@:
// kubeslot's own directory on the host (default /opt/kubeslot, the
// --host-root flag). Every stage unit runs its binary through
// @BASE@/current/, the link the upgrader flips (see DESIGN.md, "Host layout").
// units_test.go pins, for every unit that runs a kubeslot stage, that exit
// code 69 (exitcode.Deferred) is in both SuccessExitStatus= and
// RestartPreventExitStatus=, and checks the rendered files with
// systemd-analyze verify.
//
// Imported by cmd/ binaries and lib/ packages that install units or put
// them into a host's provisioning config.
package units

import (
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strings"

	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// files are the unit templates. A new kind of
// unit (.path, .timer, .target) needs its pattern added here, and a test
// fails until it is.
//
//go:embed *.service *.path
var files embed.FS

// resettingTemplate is the unit that finishes a reset (Resetting). It lives
// apart from files: it is never installed with the others, only by the
// resetter while a reset is under way.
//
//go:embed resetting/kubeslot-resetting.service
var resettingTemplate []byte

// Unit names, for callers that refer to one unit.
const (
	Bootstrap = "kubeslot-bootstrap.service"
	Watcher   = "kubeslot-watcher.service"
	Recovery  = "kubeslot-recovery.service"
	// Resetting finishes a reset after a kill or a power cut; it exists
	// only while one is under way (RenderResetting). Not in Names.
	Resetting = "kubeslot-resetting.service"
)

// ResettingWantedBy is the target whose .wants/ holds Resetting's
// enablement link.
const ResettingWantedBy = "multi-user.target"

// RenderResetting returns the Resetting unit rendered with v; request says
// the reset serves an AgentReset request (KUBESLOT_REQUEST=reset), which
// decides the order of its steps and where its result is reported.
func RenderResetting(v Vars, request bool) ([]byte, error) {
	r, err := v.replacer()
	if err != nil {
		return nil, err
	}
	mode := ""
	if request {
		mode = "reset"
	}
	return render(Resetting, []byte(strings.ReplaceAll(string(resettingTemplate), "@REQUEST@", mode)), r)
}

// PathUnit is the path unit that starts the worker for request kind (repave,
// restart, upgrade, reset).
func PathUnit(kind string) string { return "kubeslot-" + kind + ".path" }

// ConfigPath is the host path of the bootstrap configuration the
// first-boot unit passes to kubeslot-bootstrap.
const ConfigPath = "/etc/kubeslot/config.toml"

// Suffixes are the unit types this directory may hold.
var Suffixes = []string{".service", ".path", ".timer", ".target", ".socket"}

// Vars are what a unit is rendered with for one host.
type Vars struct {
	// Base is the host path of kubeslot's own directory; "" means
	// hostroot.DefaultBase.
	Base string
}

// baseRE is deliberately narrow: the base lands in ExecStart= and
// Environment= lines, where spaces, quotes, '%' (a specifier), '\' and '$'
// would all change the meaning.
var baseRE = regexp.MustCompile(`^(/[A-Za-z0-9._-]+)+$`)

// tokenRE finds template tokens, so a misspelt one is an error rather than
// text systemd would take literally.
var tokenRE = regexp.MustCompile(`@[A-Z_]+@`)

func (v Vars) replacer() (*strings.Replacer, error) {
	base := v.Base
	if base == "" {
		base = hostroot.DefaultBase
	}
	if !baseRE.MatchString(base) || path.Clean(base) != base {
		return nil, fmt.Errorf("units: host root %q: want a clean absolute path of letters, digits and . _ - (it is written into unit files)", base)
	}
	return strings.NewReplacer("@BASE@", base), nil
}

// Names lists the embedded unit files, sorted.
func Names() []string {
	entries, err := fs.ReadDir(files, ".")
	if err != nil {
		panic(err) // the embedded FS always has its root
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

// Template returns the unrendered unit file name.
func Template(name string) ([]byte, error) {
	b, err := files.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("units: no unit %q (have %s)", name, strings.Join(Names(), ", "))
	}
	return b, nil
}

// Render returns unit file name rendered with v.
func Render(name string, v Vars) ([]byte, error) {
	r, err := v.replacer()
	if err != nil {
		return nil, err
	}
	t, err := Template(name)
	if err != nil {
		return nil, err
	}
	return render(name, t, r)
}

func render(name string, t []byte, r *strings.Replacer) ([]byte, error) {
	out := []byte(r.Replace(string(t)))
	if tok := tokenRE.Find(out); tok != nil {
		line := 1 + bytes.Count(out[:bytes.Index(out, tok)], []byte("\n"))
		return nil, fmt.Errorf("units: %s line %d: unknown template token %s", name, line, tok)
	}
	return out, nil
}

// All returns every unit rendered with v, by file name.
func All(v Vars) (map[string][]byte, error) {
	r, err := v.replacer()
	if err != nil {
		return nil, err
	}
	out := make(map[string][]byte)
	for _, name := range Names() {
		t, err := files.ReadFile(name)
		if err != nil {
			return nil, err
		}
		if out[name], err = render(name, t, r); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Templates returns every embedded unit template, unrendered, by file name:
// what the bootstrap writes into a release directory's units/ when it
// installs the release it runs from.
func Templates() map[string][]byte {
	out := make(map[string][]byte)
	for _, name := range Names() {
		b, err := files.ReadFile(name)
		if err != nil {
			panic(err) // listed by Names, so present
		}
		out[name] = b
	}
	return out
}

// RenderFrom renders templates given by file name (a release directory's
// units/, which may differ from the embedded ones) with v. A name that is
// not a unit file (see Suffixes) is an error, so a bundle cannot drop
// anything else into the unit directory.
func RenderFrom(templates map[string][]byte, v Vars) (map[string][]byte, error) {
	r, err := v.replacer()
	if err != nil {
		return nil, err
	}
	out := make(map[string][]byte, len(templates))
	for name, t := range templates {
		if !validName(name) {
			return nil, fmt.Errorf("units: %q: not a kubeslot unit file name (kubeslot-*%s)", name, strings.Join(Suffixes, ", "))
		}
		if out[name], err = render(name, t, r); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// nameRE keeps rendered names plain file names under /etc/systemd/system.
var nameRE = regexp.MustCompile(`^kubeslot-[a-z0-9-]+@?\.[a-z]+$`)

func validName(name string) bool {
	if !nameRE.MatchString(name) {
		return false
	}
	for _, s := range Suffixes {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}
