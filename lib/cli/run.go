package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/alecthomas/kong"

	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/stagekit"
)

// Flags is a stage's flag struct: a pointer to a struct embedding Globals.
type Flags interface {
	Logger(stderr io.Writer, stage string) (*slog.Logger, error)
	globals() *Globals
}

// Run is every stage binary's prologue and epilogue: parse args into flags
// (--help and --version end here), build the stage's logger, run body with
// a context that SIGINT and SIGTERM end and the stage's host (the common
// flags, stdio, the logger and getenv, for lib/stagekit), and turn body's
// error into the exit code (Exit). kctx names the subcommand, for binaries
// that have them.
func Run(name, description string, flags Flags, args []string, stdio IO, getenv func(string) string,
	body func(ctx context.Context, kctx *kong.Context, h stagekit.Host) error) int {
	t0 := time.Now()
	kctx, code, done := Parse(name, description, flags, args, stdio)
	if done {
		return code
	}
	log, err := flags.Logger(stdio.Stderr, name)
	if err != nil {
		fmt.Fprintf(stdio.Stderr, "%s: %v\n", name, err)
		return exitcode.Usage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	g := flags.globals()
	h := stagekit.Host{RootPrefix: g.RootPrefix, HostRoot: g.HostRoot, SystemdBus: g.SystemdBus, Getenv: getenv,
		Stdin: stdio.Stdin, Stdout: stdio.Stdout, Log: log, Started: t0}
	return Exit(log, body(ctx, kctx, h))
}

// Reported is an error that sets the exit code without another log line:
// the stage already said what happened.
func Reported(code int) error { return exitcode.Reported(code) }
