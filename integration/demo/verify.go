package main

// `kubeslot verify` in the life cycle: after the bootstrap and after the agent upgrade the installation must verify
// clean (a problem fails the demo); after the bootstrap, an edited unit file must be named, with the documented exit
// code, and the edit is then undone byte for byte.

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/kubeslot/kubeslot/lib/verify"
	"github.com/kubeslot/kubeslot/units"
)

// verifyClean runs the current release's `kubeslot verify -o json` inside the host and fails on anything but ok.
func (d *demo) verifyClean(ctx context.Context) (string, error) {
	rep, code, raw, err := d.runVerify(ctx)
	if err != nil {
		return "", err
	}
	if code != 0 || rep.Verdict != verify.VerdictOK {
		return "", fmt.Errorf("kubeslot verify: exit %d, verdict %s:\n%s", code, rep.Verdict, indent(raw, "    "))
	}
	var identity string
	ok, skipped := 0, []string{}
	for _, c := range rep.Checks {
		if c.Name == verify.CheckIdentity {
			identity = c.Detail
		}
		if c.Status == verify.OK {
			ok++
		} else {
			skipped = append(skipped, c.Name+": "+c.Detail)
		}
	}
	detail := fmt.Sprintf("exit 0: %d checks ok", ok)
	if len(skipped) > 0 {
		detail += fmt.Sprintf(", %d skipped (%s)", len(skipped), strings.Join(skipped, "; "))
	}
	return detail + "; " + identity, nil
}

// verifyNamesEdit appends a line to a unit file kubeslot installed, checks that verify names that file's content with
// exit 3, puts the file back as it was, and checks verify is clean again.
func (d *demo) verifyNamesEdit(ctx context.Context) (string, error) {
	unit := "/etc/systemd/system/" + units.PathUnit("restart")
	orig, err := d.host.ReadFile(unit)
	if err != nil {
		return "", err
	}
	if err := d.host.WriteFile(unit, append(append([]byte{}, orig...), "# edited by the demo\n"...), 0o644); err != nil {
		return "", err
	}
	rep, code, raw, err := d.runVerify(ctx)
	if rerr := d.host.WriteFile(unit, orig, 0o644); rerr != nil && err == nil {
		err = rerr
	}
	if err != nil {
		return "", err
	}
	named := false
	for _, c := range rep.Checks {
		for _, f := range c.Findings {
			if c.Name == verify.CheckUnitFiles && f.File == unit && f.Field == "content" {
				named = true
			}
		}
	}
	if code != verify.ExitProblems || !named {
		return "", fmt.Errorf("after editing %s: kubeslot verify exit %d (want %d), naming it: %v:\n%s", unit, code, verify.ExitProblems, named, indent(raw, "    "))
	}
	if _, err := d.verifyClean(ctx); err != nil {
		return "", fmt.Errorf("after restoring %s: %w", unit, err)
	}
	return fmt.Sprintf("an appended line in %s: named (unit-files, content), exit %d; restored: ok again", unit, code), nil
}

// runVerify runs `kubeslot verify -o json` in the host and returns its report and exit code.
func (d *demo) runVerify(ctx context.Context) (*verify.Report, int, string, error) {
	out, err := d.inHost(ctx, "sh", "-c", `"$0" verify -o json 2>/dev/null; code=$?; echo; echo "exit $code"`, base+"/current/kubeslot")
	if err != nil {
		return nil, 0, out, err
	}
	body := strings.TrimSpace(out)
	i := strings.LastIndex(body, "\nexit ")
	if i < 0 {
		return nil, 0, out, fmt.Errorf("kubeslot verify: no exit status in its output:\n%s", out)
	}
	code, err := strconv.Atoi(strings.TrimSpace(body[i+len("\nexit "):]))
	if err != nil {
		return nil, 0, out, fmt.Errorf("kubeslot verify: exit status: %w", err)
	}
	var rep verify.Report
	if err := json.Unmarshal([]byte(body[:i]), &rep); err != nil {
		return nil, code, out, fmt.Errorf("kubeslot verify -o json (exit %d): %w:\n%s", code, err, out)
	}
	return &rep, code, body[:i], nil
}
