package systemdconn

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	godbus "github.com/godbus/dbus/v5"

	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
)

func TestMachinedErrors(t *testing.T) {
	for _, name := range []string{noSuchMachine, "org.freedesktop.DBus.Error.UnknownObject"} {
		err := machinedError("machine a", godbus.Error{Name: name})
		if !errors.Is(err, hostapi.ErrNoMachine) || !strings.Contains(err.Error(), "machine a") {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := machinedError("machine a", godbus.Error{Name: "org.freedesktop.DBus.Error.AccessDenied"}); errors.Is(err, hostapi.ErrNoMachine) {
		t.Errorf("access denied taken for no machine: %v", err)
	}
}

// StopUnit and ResetFailed take systemd's NoSuchUnit, and only it, for a
// unit that is stopped already.
func TestNoSuchUnit(t *testing.T) {
	if !isNoSuchUnit(godbus.Error{Name: "org.freedesktop.systemd1.NoSuchUnit"}) {
		t.Error("NoSuchUnit not recognised")
	}
	if !isNoSuchUnit(fmt.Errorf("wrapped: %w", godbus.Error{Name: "org.freedesktop.systemd1.NoSuchUnit"})) {
		t.Error("wrapped NoSuchUnit not recognised")
	}
	for _, err := range []error{nil, errors.New("org.freedesktop.systemd1.NoSuchUnit"), godbus.Error{Name: "org.freedesktop.DBus.Error.AccessDenied"}} {
		if isNoSuchUnit(err) {
			t.Errorf("%v taken for NoSuchUnit", err)
		}
	}
}
