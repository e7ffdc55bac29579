package host

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/integration/sdhost"
)

// A kubeslot binary run as a systemd service logs to the journal natively:
// its attributes become KUBESLOT_* fields, errors get priority 3, and each
// record names its unit in OBJECT_SYSTEMD_UNIT (which `journalctl -u`
// matches), so a run that exits before journald reads its cgroup stays
// findable by unit.
func TestStageLogsReachJournalAsFields(t *testing.T) {
	if err := sdhost.Available(); err != nil {
		t.Skip("rig unavailable: ", err)
	}
	bins := rig.NeedBins(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h, err := sdhost.Start(ctx, sdhost.Options{
		Name:  "ks-logs",
		Binds: []sdhost.Bind{{Source: bins, Target: "/opt/kubeslot-test", ReadOnly: true}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Stop(context.Background()); err != nil {
			t.Errorf("stop host: %v", err)
		}
	})
	// A root prefix that does not exist makes a stage (the resetter's dry run) fail with an error naming it: a log
	// record at error level. (The kubeslot CLI, for people, says its errors as a plain line instead.)
	out, err := h.Run(ctx, "systemd-run", "--unit=ks-log-probe", "--wait", "--quiet",
		"/opt/kubeslot-test/kubeslot-resetter", "--root-prefix=/no/such/prefix", "--dry-run")
	if err == nil {
		t.Fatalf("kubeslot-resetter --dry-run with a missing prefix succeeded: %s", out)
	}
	var journal string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		b, _ := h.Run(ctx, "journalctl", "--no-pager", "-o", "verbose", "-u", "ks-log-probe", "KUBESLOT_STAGE=kubeslot-resetter")
		if journal = string(b); strings.Contains(journal, "KUBESLOT_ERR=") {
			break
		}
	}
	for _, want := range []string{"KUBESLOT_STAGE=kubeslot-resetter", "KUBESLOT_ERR=", "/no/such/prefix", "PRIORITY=3", "MESSAGE=failed",
		"OBJECT_SYSTEMD_UNIT=ks-log-probe.service"} {
		if !strings.Contains(journal, want) {
			t.Errorf("journal record lacks %q:\n%s", want, journal)
		}
	}
}
