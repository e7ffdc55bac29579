package rig

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/kubeslot/kubeslot/lib/verify"
)

// Verify runs the current release's `kubeslot verify -o json` in the host: the report, the exit code, the output.
func (r *Rig) Verify(ctx context.Context) (*verify.Report, int, string) {
	r.t.Helper()
	out, _ := r.H.Run(ctx, "sh", "-c", `/opt/kubeslot/current/kubeslot verify -o json; echo "exit $?"`)
	s := strings.TrimSpace(string(out))
	i := strings.LastIndex(s, "exit ")
	if i < 0 {
		r.t.Fatalf("kubeslot verify: no exit status:\n%s", s)
	}
	var code int
	fmt.Sscanf(s[i:], "exit %d", &code)
	var rep verify.Report
	if err := json.Unmarshal([]byte(s[:i]), &rep); err != nil {
		r.t.Fatalf("kubeslot verify -o json (exit %d): %v:\n%s", code, err, s)
	}
	return &rep, code, s[:i]
}
