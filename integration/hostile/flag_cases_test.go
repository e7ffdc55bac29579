package hostile

import (
	"os"
	"path/filepath"
	"strings"
)

// flagCases are command lines and environments no binary may act on: each
// is refused with the flag or variable named, before anything changes.
func flagCases() []hcase {
	usage := func(name, bin string, want []string, environ []string, args func(e *env) []string) hcase {
		return hcase{name: name, bin: bin, code: 2, want: want, environ: environ,
			setup: func(e *env) []string { return args(e) },
			check: func(e *env, _ string) {
				if ents, _ := os.ReadDir(e.prefix); len(ents) != 0 {
					e.t.Errorf("a refused command line changed the root prefix: %v", ents)
				}
			}}
	}
	none := func(*env) []string { return nil }
	var out []hcase
	// A root prefix or host root the stage cannot use is a usage error in
	// every binary, naming it.
	for _, b := range allBinaries {
		b := b
		args := func(extra ...string) func(*env) []string {
			return func(e *env) []string {
				switch b {
				case "kubeslot":
					return append([]string{"status"}, extra...)
				case "kubeslot-bootstrap":
					if e != nil {
						return append([]string{"--config", e.config()}, extra...)
					}
				}
				return extra
			}
		}
		const code = 2
		out = append(out,
			usage(b+" --log-level trace", b, []string{"--log-level"}, nil, args("--log-level", "trace")),
			usage(b+" unknown flag", b, []string{"--frobnicate"}, nil, args("--frobnicate")),
			hcase{name: b + " relative --root-prefix", bin: b, noPrefix: true, code: code, want: []string{"root prefix", "absolute"},
				setup: func(e *env) []string { return append(args()(e), "--root-prefix", "tmp/sandbox") }},
			hcase{name: b + " missing --root-prefix", bin: b, noPrefix: true, code: code, want: []string{"no-such-dir"},
				setup: func(e *env) []string {
					return append(args()(e), "--root-prefix", filepath.Join(e.scratch, "no-such-dir"))
				}},
			hcase{name: b + " --root-prefix a file", bin: b, noPrefix: true, code: code, want: []string{"not a directory"},
				setup: func(e *env) []string { return append(args()(e), "--root-prefix", e.file("f", "x", 0o600)) }},
			hcase{name: b + " --host-root /", bin: b, code: code, want: []string{"host root", "below /"},
				setup: func(e *env) []string { return append(args()(e), "--host-root", "/") }},
		)
	}
	out = append(out,
		usage("status -o yaml", "kubeslot", []string{"-o"}, nil, func(*env) []string { return []string{"status", "-o", "yaml"} }),
		installedRefusal("repaver slot c", "kubeslot-repaver", nil, "c"),
		installedRefusal("repaver slot climbing", "kubeslot-repaver", nil, "../a"),
		installedRefusal("repaver KUBESLOT_SLOT with a slash", "kubeslot-repaver", []string{"KUBESLOT_SLOT=a/../b"}),
		usage("repaver KUBESLOT_REQUEST unknown", "kubeslot-repaver", []string{"KUBESLOT_REQUEST"}, []string{"KUBESLOT_REQUEST=rm"}, func(e *env) []string { return e.noBus() }),
		usage("repaver negative --lock-wait", "kubeslot-repaver", []string{"--lock-wait"}, nil, func(e *env) []string { return append(e.noBus(), "--lock-wait", "-1s") }),
		usage("upgrader KUBESLOT_REQUEST of a reset", "kubeslot-upgrader", []string{"KUBESLOT_REQUEST"}, []string{"KUBESLOT_REQUEST=reset"}, func(e *env) []string { return e.noBus() }),
		usage("upgrader --json without --preflight", "kubeslot-upgrader", []string{"--json"}, nil, func(e *env) []string { return append(e.noBus(), "--json") }),
		usage("upgrader --sha256 not hex", "kubeslot-upgrader", []string{"sha256"}, nil, func(e *env) []string {
			return append(e.noBus(), "--bundle", e.file("b.tar.gz", "x", 0o600), "--sha256", "../../etc")
		}),
		usage("resetter KUBESLOT_REQUEST unknown", "kubeslot-resetter", []string{"KUBESLOT_REQUEST"}, []string{"KUBESLOT_REQUEST=upgrade"}, none),
		usage("resetter KUBESLOT_TEST_PAUSE_AT unknown", "kubeslot-resetter", []string{"KUBESLOT_TEST_PAUSE_AT"}, []string{"KUBESLOT_TEST_PAUSE_AT=nowhere"}, func(*env) []string { return []string{"--yes"} }),
		usage("watcher --upgrade-probation zero", "kubeslot-watcher", []string{"--upgrade-probation"}, nil, func(*env) []string { return []string{"--upgrade-probation", "0s"} }),
		usage("bootstrap without a bus", "kubeslot-bootstrap", []string{"--systemd-bus", "nothing was changed"}, nil, func(e *env) []string {
			return []string{"--config", e.config()}
		}),
		usage("upgrader recover without a bus", "kubeslot-upgrader", []string{"--systemd-bus", "nothing was changed"}, nil, func(*env) []string { return []string{"recover"} }),
		usage("repaver without a bus", "kubeslot-repaver", []string{"--systemd-bus", "nothing was changed"}, nil, none),
		usage("upgrader without a bus", "kubeslot-upgrader", []string{"--systemd-bus", "nothing was changed"}, nil, none),
	)
	return out
}

// lockCases plant hostile things where the installation lock goes; no
// stage may open, truncate or chmod through them, or hang on them.
func lockCases() []hcase {
	planted := func(name, bin string, plant func(e *env, lock string), args func(e *env) []string, want ...string) hcase {
		return hcase{name: "lock " + name, bin: bin, code: 1, want: want,
			setup: func(e *env) []string {
				e.installed()
				lock, _ := e.root.Lock()
				os.MkdirAll(filepath.Dir(lock), 0o755)
				plant(e, lock)
				return args(e)
			}}
	}
	fifo := func(e *env, lock string) { e.fifo(lock) }
	dir := func(e *env, lock string) { os.Mkdir(lock, 0o700) }
	devZero := func(e *env, lock string) { os.Symlink("/dev/zero", lock) }
	outside := func(e *env, lock string) { os.Symlink(e.victim(), lock) }
	upgrader := func(e *env) []string { return append(e.noBus(), "--lock-wait", "1s") }
	repaver := func(e *env) []string { return append(e.noBus(), "--restart", "--lock-wait", "1s") }
	resetter := func(e *env) []string { return append(e.noBus(), "--yes", "--lock-wait", "1s") }
	watcher := func(e *env) []string { return []string{"--lock-wait", "1s"} }
	cases := []hcase{
		planted("FIFO for the upgrader", "kubeslot-upgrader", fifo, upgrader, "not a regular file"),
		planted("directory for the upgrader", "kubeslot-upgrader", dir, upgrader, "install.lock"),
		planted("link to /dev/zero for the upgrader", "kubeslot-upgrader", devZero, upgrader, "not a regular file"),
		planted("FIFO for the repaver", "kubeslot-repaver", fifo, repaver, "not a regular file"),
		planted("link out of the root for the repaver", "kubeslot-repaver", outside, repaver, "not a regular file"),
		planted("link out of the root for the resetter", "kubeslot-resetter", outside, resetter, "not a regular file"),
		planted("FIFO for the watcher", "kubeslot-watcher", fifo, watcher, "not a regular file"),
	}
	for i := range cases {
		prev := cases[i].check
		cases[i].check = func(e *env, out string) {
			if v := filepath.Join(e.scratch, "victim"); fileExists(v) {
				e.victimIntact(v)
			}
			if prev != nil {
				prev(e, out)
			}
		}
	}
	return cases
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// installedRefusal runs a repaver target no configuration names against a
// complete installation: refused, naming it, nothing started.
func installedRefusal(name, bin string, environ []string, args ...string) hcase {
	return hcase{name: name, bin: bin, code: 2, environ: environ, want: []string{"slot"},
		setup: func(e *env) []string {
			e.installed()
			return append(append(e.noBus(), "--lock-wait", "1s"), args...)
		},
		check: func(e *env, out string) {
			if strings.Contains(out, "no-bus") {
				e.t.Errorf("the refused target reached systemd: %s", out)
			}
		}}
}
