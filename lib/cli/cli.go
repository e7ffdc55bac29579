// Package cli holds what every kubeslot binary shares on its command line:
// the common flags (--version, --log-format, --log-level, --root-prefix,
// --host-root), flag parsing with kong, the stage's lib/stagekit.Host built
// from them, and the mapping of a returned error to an exit code. Imported
// by cmd/ main packages (and lib/cli/clitest) only.
package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/alecthomas/kong"

	"github.com/kubeslot/kubeslot/lib/buildinfo"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/logging"
	"github.com/kubeslot/kubeslot/lib/systemdconn"
)

// Globals are embedded in every binary's flag struct.
type Globals struct {
	Version    kong.VersionFlag `help:"Print the version and exit."`
	LogFormat  string           `help:"Log format on stderr: text or json (under systemd, logs go to the journal with structured fields)." enum:"text,json" default:"text"`
	LogLevel   string           `help:"Lowest level logged: debug, info, warn or error." enum:"debug,info,warn,error" default:"info"`
	RootPrefix string           `help:"Directory that stands for the host's / (tests and sandboxes)." env:"KUBESLOT_ROOT_PREFIX" default:"/" placeholder:"DIR"`
	HostRoot   string           `help:"kubeslot's own directory on the host." env:"KUBESLOT_HOST_ROOT" default:"/opt/kubeslot" placeholder:"DIR"`
	// SystemdBus is the D-Bus address of the systemd that manages the root
	// prefix. With a prefix other than /, stages act on no systemd without
	// it (lib/systemdconn.For): never on this machine's own by default.
	SystemdBus string `help:"D-Bus address of the systemd that manages --root-prefix (required for a prefix other than / whenever a stage needs systemd), e.g. unix:path=/proc/PID/root/run/dbus/system_bus_socket." env:"KUBESLOT_SYSTEMD_BUS" placeholder:"ADDRESS"`
}

func (g *Globals) globals() *Globals { return g }

// SystemdUser is implemented by the flags of a stage that acts through
// systemd. SystemdNeeded says whether this invocation does (a preflight or a
// dry run does not); Parse then refuses a root prefix other than / without
// --systemd-bus as a usage error, before the stage reads or changes anything,
// instead of at its first systemd call with the host half changed.
type SystemdUser interface{ SystemdNeeded() bool }

// SystemdRefusal is the error a stage with these flags gets from every
// systemd call (lib/systemdconn.Refusal), or nil.
func (g *Globals) SystemdRefusal() error { return systemdconn.Refusal(g.RootPrefix, g.SystemdBus) }

// check refuses what kong cannot: an empty --root-prefix or --host-root
// (given as "" or through an empty environment variable) would otherwise mean
// "/" or the default base silently, and a sandboxed run would act on the host.
func (g *Globals) check() error {
	if g.RootPrefix == "" {
		return fmt.Errorf("--root-prefix (or %s) is empty: give a directory, or / for this host", hostroot.EnvPrefix)
	}
	if g.HostRoot == "" {
		return errors.New("--host-root (or KUBESLOT_HOST_ROOT) is empty: give kubeslot's directory, e.g. /opt/kubeslot")
	}
	return nil
}

func (g *Globals) validRoot() bool { _, err := g.Root(); return err == nil }

// Root builds the host-root resolver from the flags. A prefix or host root
// it cannot use is a usage error (exit 2) in every binary: running again
// cannot help, so a unit must not restart on it.
func (g *Globals) Root() (*hostroot.Root, error) {
	r, err := hostroot.New(g.RootPrefix, g.HostRoot)
	if err != nil {
		return nil, exitcode.UsageError(err)
	}
	return r, nil
}

// Logger builds the process logger for stage.
func (g *Globals) Logger(stderr io.Writer, stage string) (*slog.Logger, error) {
	return logging.New(stderr, logging.Options{
		Format:  g.LogFormat,
		Level:   g.LogLevel,
		Journal: logging.UnderJournal(),
		Stage:   stage,
	})
}

// IO is where a binary reads and writes; tests substitute buffers.
type IO struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

// StdIO is the process's own standard streams.
func StdIO() IO { return IO{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr} }

// Parse parses args into flags (a pointer to a struct embedding Globals).
// It returns the kong context, or an exit code when the process should end
// now: 0 after --help or --version, exitcode.Usage for bad arguments.
func Parse(name, description string, flags any, args []string, stdio IO) (*kong.Context, int, bool) {
	code, exited := 0, false
	parser, err := kong.New(flags,
		kong.Name(name),
		kong.Description(description),
		kong.UsageOnError(),
		kong.Vars{"version": name + " " + buildinfo.Version},
		kong.Writers(stdio.Stdout, stdio.Stderr),
		kong.Exit(func(c int) { code, exited = c, true; panic(exitSignal{}) }),
	)
	if err != nil {
		// A broken flag struct is a programming error, caught by tests.
		panic(err)
	}
	var ctx *kong.Context
	func() {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(exitSignal); !ok {
					panic(r)
				}
			}
		}()
		ctx, err = parser.Parse(args)
	}()
	if exited {
		return nil, code, true
	}
	if err == nil {
		if g, ok := flags.(interface{ globals() *Globals }); ok {
			err = g.globals().check()
			// A prefix that is no directory is the stage's own error to
			// report (naming the prefix), not a systemd one.
			if u, ok := flags.(SystemdUser); ok && err == nil && u.SystemdNeeded() && g.globals().validRoot() {
				if err = g.globals().SystemdRefusal(); err != nil {
					err = fmt.Errorf("%w; nothing was changed", err)
				}
			}
		}
	}
	if err != nil {
		var pe *kong.ParseError
		if errors.As(err, &pe) {
			_ = pe.Context.PrintUsage(true)
		}
		fmt.Fprintf(stdio.Stderr, "%s: error: %v\n", name, err)
		return nil, exitcode.Usage, true
	}
	return ctx, 0, false
}

// exitSignal unwinds kong's --help/--version handling without os.Exit, so
// Parse stays testable.
type exitSignal struct{}

// Exit reports err (if any) and returns the exit code for it. A deferral is
// logged at info level: it is not a failure.
func Exit(log *slog.Logger, err error) int {
	code := exitcode.Of(err)
	switch {
	case err == nil, errors.Is(err, ErrReported):
	case code == exitcode.Deferred:
		log.Info("deferred", "reason", err.Error())
	default:
		log.Error("failed", "err", err.Error())
	}
	return code
}

// ExitPlain is Exit for a CLI people run (kubeslot): err, if any, is one
// plain line on w, "<name>: <err>", not a log record; a deferral says so.
func ExitPlain(w io.Writer, name string, err error) int {
	code := exitcode.Of(err)
	switch {
	case err == nil, errors.Is(err, ErrReported):
	case code == exitcode.Deferred:
		fmt.Fprintf(w, "%s: deferred (try again later): %v\n", name, err)
	default:
		fmt.Fprintf(w, "%s: %v\n", name, err)
	}
	return code
}

// ErrReported means the command already told the person what went wrong
// (on stdout or stderr, in its own words); Exit only sets the exit code.
var ErrReported = exitcode.ErrReported
