package upgrade

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"

	"github.com/kubeslot/kubeslot/lib/artifact"
	"github.com/kubeslot/kubeslot/lib/bundle"
	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
	"github.com/kubeslot/kubeslot/lib/systemdconn"
)

// DBus is the real Systemd: go-systemd's D-Bus client, connected on first
// use so that a run refused before it touches systemd (busy lock, nothing to
// do) never needs the bus. Life is the connection's lifetime (the process's
// context); the dial itself is bounded (systemdconn.Once).
type DBus struct {
	Life context.Context
	// Address and Refused: as systemdconn.Lazy (systemdconn.For decides).
	Address string
	Refused error
	once    systemdconn.Once[*sddbus.Conn]
}

var _ Systemd = (*DBus)(nil)

func (s *DBus) get(ctx context.Context) (*sddbus.Conn, error) {
	if s.Refused != nil {
		return nil, s.Refused
	}
	return s.once.Get(ctx, s.Life, func(life context.Context) (*sddbus.Conn, error) {
		if s.Address != "" {
			c, err := sddbus.NewConnection(func() (*godbus.Conn, error) { return hostapi.DialBus(life, s.Address) })
			if err != nil {
				return nil, fmt.Errorf("connect to systemd at %s: %w", s.Address, err)
			}
			return c, nil
		}
		c, err := sddbus.NewWithContext(life)
		if err != nil {
			return nil, fmt.Errorf("connect to systemd over D-Bus: %w", err)
		}
		return c, nil
	})
}

// Close closes the connection if one was made.
func (s *DBus) Close() {
	if c, ok := s.once.Made(); ok {
		c.Close()
	}
}

// DaemonReload implements Systemd.
func (s *DBus) DaemonReload(ctx context.Context) error {
	c, err := s.get(ctx)
	if err != nil {
		return err
	}
	if err := c.ReloadContext(ctx); err != nil {
		return fmt.Errorf("systemd daemon-reload: %w", err)
	}
	return nil
}

// RestartUnit implements Systemd: it queues the job and does not wait.
func (s *DBus) RestartUnit(ctx context.Context, name string) error {
	c, err := s.get(ctx)
	if err != nil {
		return err
	}
	if _, err := c.RestartUnitContext(ctx, name, "replace", nil); err != nil {
		return fmt.Errorf("restart %s: %w", name, err)
	}
	return nil
}

// ResetFailed implements Systemd; a unit systemd does not know is fine.
func (s *DBus) ResetFailed(ctx context.Context, name string) error {
	c, err := s.get(ctx)
	if err != nil {
		return err
	}
	err = c.ResetFailedUnitContext(ctx, name)
	var de godbus.Error
	if errors.As(err, &de) && de.Name == "org.freedesktop.systemd1.NoSuchUnit" {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reset-failed %s: %w", name, err)
	}
	return nil
}

// StopUnit implements Systemd.
func (s *DBus) StopUnit(ctx context.Context, name string) error {
	c, err := s.get(ctx)
	if err != nil {
		return err
	}
	done := make(chan string, 1)
	_, err = c.StopUnitContext(ctx, name, "replace", done)
	var de godbus.Error
	if errors.As(err, &de) && de.Name == "org.freedesktop.systemd1.NoSuchUnit" {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stop %s: %w", name, err)
	}
	select {
	case r := <-done:
		if r != "done" {
			return fmt.Errorf("stop %s: job %s", name, r)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop %s: %w", name, context.Cause(ctx))
	}
}

// Unit implements Systemd.
func (s *DBus) Unit(ctx context.Context, name string) (UnitStatus, error) {
	var st UnitStatus
	c, err := s.get(ctx)
	if err != nil {
		return st, err
	}
	props, err := c.GetUnitPropertiesContext(ctx, name)
	if err != nil {
		return st, fmt.Errorf("properties of %s: %w", name, err)
	}
	st.ActiveState, _ = props["ActiveState"].(string)
	st.SubState, _ = props["SubState"].(string)
	if id, ok := props["InvocationID"].([]byte); ok {
		st.InvocationID = hex.EncodeToString(id)
	}
	svc, err := c.GetUnitTypePropertiesContext(ctx, name, "Service")
	if err != nil {
		return st, fmt.Errorf("service properties of %s: %w", name, err)
	}
	st.MainPID, _ = svc["MainPID"].(uint32)
	st.NRestarts, _ = svc["NRestarts"].(uint32)
	return st, nil
}

// ExecRunner is the real Runner: the program with a minimal environment,
// its stdout returned (bounded), stderr quoted in the error.
type ExecRunner struct{}

// maxOutput bounds what is kept of a program's output.
const maxOutput = 64 << 10

type capped struct{ bytes.Buffer }

func (c *capped) Write(p []byte) (int, error) {
	if room := maxOutput - c.Len(); room > 0 {
		if len(p) > room {
			c.Buffer.Write(p[:room])
		} else {
			c.Buffer.Write(p)
		}
	}
	return len(p), nil
}

// Output implements Runner.
func (ExecRunner) Output(ctx context.Context, path string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	var out, errb capped
	cmd.Stdout, cmd.Stderr = &out, &errb
	// A child that keeps the pipes open must not outlive the bound.
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		tail := errb.String()
		if len(tail) > 200 {
			tail = tail[len(tail)-200:]
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("did not finish within its bound: %w (%q)", err, tail)
		}
		return nil, fmt.Errorf("%w (%q)", err, tail)
	}
	return out.Bytes(), nil
}

// ProcExe is the real Deps.Exe: the target of /proc/<pid>/exe.
func ProcExe(pid uint32) (string, error) {
	return os.Readlink("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/exe")
}

// CacheFetcher is the real Fetcher: lib/artifact's verified, bounded,
// retried download into the content-addressed cache.
type CacheFetcher struct{ F *artifact.Fetcher }

// Fetch implements Fetcher.
func (c CacheFetcher) Fetch(ctx context.Context, source, sha256hex string) (string, error) {
	return c.F.Ensure(ctx, source, sha256hex)
}

// Cached implements Fetcher.
func (c CacheFetcher) Cached(sha256hex string) string {
	p, err := c.F.CachePath(sha256hex)
	if err != nil {
		return ""
	}
	if err := artifact.Verify(p, sha256hex); err != nil {
		return ""
	}
	return p
}

// BundleFiles is the real Bundles: lib/bundle with lim.
type BundleFiles struct{ Limits bundle.Limits }

// Unpack implements Bundles.
func (b BundleFiles) Unpack(ctx context.Context, path, wantSHA256, wantArch, dest string) (*bundle.Manifest, error) {
	return bundle.Unpack(ctx, path, wantSHA256, wantArch, dest, b.Limits)
}

// ReadManifest implements Bundles.
func (BundleFiles) ReadManifest(dir string) (*bundle.Manifest, error) {
	return bundle.ReadManifest(dir)
}
