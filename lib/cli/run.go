package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/alecthomas/kong"

	"github.com/kubeslot/kubeslot/lib/exitcode"
)

// Flags is a stage's flag struct: a pointer to a struct embedding Globals.
type Flags interface {
	Logger(stderr io.Writer, stage string) (*slog.Logger, error)
}

// Run is every stage binary's prologue and epilogue: parse args into flags
// (--help and --version end here), build the stage's logger, run body with
// a context that SIGINT and SIGTERM end, and turn body's error into the
// exit code (Exit). kctx names the subcommand, for binaries that have them.
func Run(name, description string, flags Flags, args []string, stdio IO, body func(ctx context.Context, kctx *kong.Context, log *slog.Logger) error) int {
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
	return Exit(log, body(ctx, kctx, log))
}

// Reported is an error that sets the exit code without another log line:
// the stage already said what happened.
func Reported(code int) error { return &exitcode.Error{Code: code, Err: ErrReported} }
