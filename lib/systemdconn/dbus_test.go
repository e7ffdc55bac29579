package systemdconn

import (
	"errors"
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
