// Package upgrade is the agent upgrade: it replaces kubeslot itself (every
// binary and unit file, as one bundle) on a running host, without touching
// the node, and rolls back when the new watcher does not stay up.
//
// The transition, phase by phase (Run):
//
//	preflight   versions from -> to, the release directory to unpack into
//	download    into the artifact cache (bounded size and time, sha256); a
//	            local --bundle file is used in place
//	last-good   <base>/last-good -> the running release
//	unpack      bundle.Unpack into releases/<inactive> (staged, renamed)
//	smoke-test  every binary's --version runs within 5 s and prints
//	            "<name> <manifest version>"
//	signal      state/upgrade-pending.json (lib/requests): from/to releases
//	            and versions; from here on it is the durable state
//	switch      <base>/current -> the new release (atomic)
//	units       the new release's unit files, journalled; units kubeslot
//	            installed that it does not have stopped and removed;
//	            daemon-reload
//	restart     the installation lock is released (the new watcher takes it
//	            at start); the watcher, started through current, has
//	            re-executed the new binary in place on the switch; when the
//	            watcher's unit file changed (or it did not re-execute within
//	            10 s, or is not running) kubeslot-watcher.service is restarted
//	health      the watcher is active, its MainPID runs the new release's
//	            binary, and neither its PID nor its restart counter change for
//	            the health window, within the health timeout
//
// The phases are a table run by lib/transition (progress status and test
// pause before each phase, "upgrade phase started/done" logs, timings; a
// failure in switch, units, restart or health goes to rollback, a SIGTERM
// stops the run for a resume).
//
// A failure before the switch writes the request's status Failed (nothing
// was switched; the half-made release directory is removed). A failure after
// the switch rolls back (current -> last-good, its unit files, the watcher
// restarted) and records the reason in the signal: from then on the watcher
// that runs reports the outcome, never the upgrader, so Succeeded is only
// ever reported by the new release and Failed by the old one.
//
// Every phase is idempotent, so a run killed anywhere is finished by the next
// one (the path unit starting the service again, or the binary run again):
// without a signal it starts again from download; with one it switches again
// or redoes units, restart and health gate. <base>/current only ever names a
// release whose binaries ran their smoke test.
//
// Recover is the last resort for a release that fails after the upgrader
// is gone: kubeslot-recovery.service (the watcher's OnFailure=) runs the
// last-good release's upgrader, which points current back at last-good. The
// new watcher reports Succeeded once the signal is verified and keeps the
// release on probation (requests.Probation) before it moves last-good to
// it, so a failure on probation is still rolled back; Recover records that
// in the probation file for the recovered watcher to publish.
//
// Imported by cmd/kubeslot-upgrader only.
package upgrade

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/kubeslot/kubeslot/lib/bundle"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/systemdconn"
)

// Phase names a step of the upgrade, as it appears in statuses, the signal
// and the test hook.
type Phase string

// The phases, in order, and the rollback.
const (
	Preflight Phase = "preflight"
	Download  Phase = "download"
	LastGood  Phase = "last-good"
	Unpack    Phase = "unpack"
	SmokeTest Phase = "smoke-test"
	Signal    Phase = "signal"
	Switch    Phase = "switch"
	Units     Phase = "units"
	Restart   Phase = "restart"
	Health    Phase = "health"
	Rollback  Phase = "rollback"
	// Recovery is `kubeslot-upgrader recover`'s one phase (Recover).
	Recovery Phase = "recover"
)

// Phases lists every phase of an upgrade, in order.
func Phases() []Phase {
	return []Phase{Preflight, Download, LastGood, Unpack, SmokeTest, Signal, Switch, Units, Restart, Health, Rollback}
}

// WatcherUnit is the unit the health gate is about.
const WatcherUnit = "kubeslot-watcher.service"

// Defaults of Job's bounds.
const (
	DefaultHealthWindow  = 5 * time.Second
	DefaultHealthTimeout = 45 * time.Second
	DefaultLockWait      = 30 * time.Second
	// A watcher re-executes within about a second of the flip; the rest is
	// room for a loaded host.
	DefaultHandoverTimeout = 10 * time.Second
	// DefaultVersionTimeout bounds one `--version` of the smoke test.
	DefaultVersionTimeout = 5 * time.Second
	// DefaultPollInterval is how often the health gate reads the unit.
	DefaultPollInterval = 200 * time.Millisecond
	// callTimeout bounds one D-Bus call.
	callTimeout = 25 * time.Second
)

// Systemd is what the upgrade asks of systemd. RestartUnit only queues the
// job (it also starts an inactive unit): the health gate watches the unit
// itself, since the start job of a unit that crash-loops need not finish
// within any bound. The real implementation is lib/systemdconn.Client
// (with NoMachined).
type Systemd interface {
	// Reload is a daemon-reload.
	Reload(ctx context.Context) error
	RestartUnit(ctx context.Context, name string) error
	// StopUnit stops a unit and waits for the job; a unit systemd does not
	// know is stopped already.
	StopUnit(ctx context.Context, name string) error
	ResetFailed(ctx context.Context, name string) error
	ServiceStatus(ctx context.Context, name string) (systemdconn.ServiceStatus, error)
}

// Fetcher brings a bundle into the artifact cache.
type Fetcher interface {
	// Fetch returns the local path of the verified bundle from source.
	Fetch(ctx context.Context, source, sha256hex string) (string, error)
	// Cached returns the local path of a verified cached bundle, or "".
	Cached(sha256hex string) string
}

// Bundles is lib/bundle, behind an interface so the phases can be tested
// with fake releases.
type Bundles interface {
	Unpack(ctx context.Context, path, wantSHA256, wantArch, dest string) (*bundle.Manifest, error)
	ReadManifest(dir string) (*bundle.Manifest, error)
}

// Runner runs a program and returns its standard output.
type Runner interface {
	Output(ctx context.Context, path string, args ...string) ([]byte, error)
}

// Deps are the upgrade's collaborators.
type Deps struct {
	Root *hostroot.Root
	Log  *slog.Logger
	// Begin is the stage prologue: the installation lock (busy: 69), then
	// the admission it is given (stagekit.Driver.Begin).
	Begin    func(context.Context, ownership.Prologue) (*ownership.Held, error)
	Requests *requests.Dir
	Systemd  Systemd
	Fetcher  Fetcher
	Bundles  Bundles
	Exec     Runner
	// Exe resolves the executable of a process (/proc/<pid>/exe).
	Exe func(pid uint32) (string, error)
	// Arch is the architecture a bundle must be for (buildinfo.Arch).
	Arch string
	// TrustedKeys are the host's [upgrade] trusted_keys: with any, a
	// bundle must come with a signature by one of them, read by Signature
	// (the bundle's source, and whether it is a local file of an upgrade
	// by hand) and checked before anything is unpacked.
	TrustedKeys []string
	Signature   func(ctx context.Context, source string) ([]byte, error)
	// TrustedKeysErr is why the trusted keys could not be read: every
	// download is then refused (the keys may have named some), and the
	// request fails with it rather than the worker looping.
	TrustedKeysErr error
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// After is the wait between two reads of the watcher unit (nil:
	// time.After); with Now, tests run the gate's bounds on a fake clock.
	After func(time.Duration) <-chan time.Time
	// PollInterval and VersionTimeout, zero for DefaultPollInterval and
	// DefaultVersionTimeout, are shortened by tests.
	PollInterval, VersionTimeout time.Duration
	// Pause, test-only, runs before each phase (after its progress status
	// is written; lib/stagekit); an error ends the run as a crash would (no
	// failure handling, no cleanup).
	Pause func(ctx context.Context, phase string) error
}

func (d *Deps) now() time.Time {
	if d.Now != nil {
		return d.Now()
	}
	return time.Now()
}

// poll waits one poll interval.
func (d *Deps) poll() <-chan time.Time {
	if d.After != nil {
		return d.After(d.pollInterval())
	}
	return time.After(d.pollInterval())
}

func (d *Deps) pollInterval() time.Duration {
	if d.PollInterval > 0 {
		return d.PollInterval
	}
	return DefaultPollInterval
}

func (d *Deps) versionTimeout() time.Duration {
	if d.VersionTimeout > 0 {
		return d.VersionTimeout
	}
	return DefaultVersionTimeout
}

func (d *Deps) check() error {
	switch {
	case d.Root == nil, d.Log == nil, d.Begin == nil, d.Requests == nil, d.Systemd == nil, d.Fetcher == nil, d.Bundles == nil, d.Exec == nil, d.Exe == nil:
		return errors.New("upgrade: incomplete dependencies")
	case d.Arch == "":
		return errors.New("upgrade: no architecture")
	case len(d.TrustedKeys) > 0 && d.Signature == nil:
		return errors.New("upgrade: trusted keys but no way to read a signature")
	}
	return nil
}

// Job is what one run was asked to do.
type Job struct {
	// Stage names the lock holder (the binary).
	Stage string
	// Bundle is a bundle file for an upgrade by hand; SHA256 its expected
	// digest (optional).
	Bundle, SHA256 string
	// Triggered means started for a request (KUBESLOT_REQUEST=upgrade): no
	// request to claim is nothing to do, not a usage error.
	Triggered bool
	// Bounds; zero means the default.
	HealthWindow, HealthTimeout, LockWait time.Duration
	// HandoverTimeout bounds the wait for the watcher to re-execute the
	// new release in place before its unit is restarted instead.
	HandoverTimeout time.Duration
}

func (j *Job) defaults() {
	if j.HealthWindow <= 0 {
		j.HealthWindow = DefaultHealthWindow
	}
	if j.HealthTimeout <= 0 {
		j.HealthTimeout = DefaultHealthTimeout
	}
	if j.LockWait <= 0 {
		j.LockWait = DefaultLockWait
	}
	if j.HandoverTimeout <= 0 {
		j.HandoverTimeout = DefaultHandoverTimeout
	}
	if j.Stage == "" {
		j.Stage = "kubeslot-upgrader"
	}
}

// Result says what a run did.
type Result struct {
	RequestID   string `json:"requestID,omitempty"`
	FromRelease string `json:"fromRelease,omitempty"`
	FromVersion string `json:"fromVersion,omitempty"`
	ToRelease   string `json:"toRelease,omitempty"`
	ToVersion   string `json:"toVersion,omitempty"`
	// Outcome: upgraded, rolled-back, refused (failed before the switch),
	// recovered, nothing.
	Outcome string `json:"outcome"`
	Message string `json:"message,omitempty"`
	// Took is the whole run; Healthy the time from the switch to the end of
	// the health gate; RolledBack from the switch to the old watcher active.
	Took       time.Duration `json:"took"`
	Healthy    time.Duration `json:"healthy,omitempty"`
	RolledBack time.Duration `json:"rolledBack,omitempty"`
}

// Outcomes.
const (
	Upgraded   = "upgraded"
	RolledBack = "rolled-back"
	Refused    = "refused"
	Recovered  = "recovered"
	Nothing    = "nothing"
)

// ErrRolledBack wraps the failure of an upgrade that was rolled back: the
// old release runs again.
var ErrRolledBack = errors.New("upgrade rolled back")

// ErrRefused wraps the failure of an upgrade refused before the switch.
var ErrRefused = errors.New("upgrade refused")

// interrupted marks an error that ends the run as a crash would: the test
// hook, or the process being stopped. No failure is recorded; the next run
// resumes.
type interrupted struct{ err error }

func (e *interrupted) Error() string { return "interrupted: " + e.err.Error() }
func (e *interrupted) Unwrap() error { return e.err }

func isInterrupted(ctx context.Context, err error) bool {
	var i *interrupted
	return errors.As(err, &i) || ctx.Err() != nil
}

func bounded(s string) string {
	if len(s) > requests.MaxMessage {
		return s[:requests.MaxMessage]
	}
	return s
}
