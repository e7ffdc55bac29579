package verify

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/nodeidentity"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/unitinstall"
)

// checkMachine checks the active slot's node: its boot link in place, its
// unit active, and machined's machine running. An error reaching systemd
// or machined is returned, not made a finding.
func checkMachine(ctx context.Context, root *hostroot.Root, sd Systemd, active *state.Applied) (Result, error) {
	if active == nil {
		return Result{Name: CheckMachine, Status: Skipped, Detail: "no readable active slot (see " + CheckApplied + ")"}, nil
	}
	mode, err := isolation.AppliedMode(active)
	if err != nil {
		return result(CheckMachine, []Finding{{File: root.HostPath(hostroot.AppliedDir, active.Slot+".json"), Field: "mode", Value: err.Error()}}, ""), nil
	}
	slot := active.Slot
	unit := mode.MachineUnit(slot)
	var findings []Finding
	if l := mode.BootLink(slot); l.Path != "" {
		local, err := unitinstall.LocalEntry(root, l.Path)
		if err == nil {
			_, err = os.Readlink(local)
		}
		if err != nil {
			findings = append(findings, Finding{File: l.Path, Field: "target", Value: "not a link: " + errText(err), Want: "the link that starts " + unit + " at boot"})
		}
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	st, sub, err := sd.UnitState(cctx, unit)
	if err != nil {
		return Result{Name: CheckMachine}, err
	}
	if st != "active" {
		findings = append(findings, Finding{File: unit, Field: "ActiveState", Value: st + "/" + sub, Want: "active"})
	}
	m, err := sd.Machine(cctx, slot)
	switch {
	case errors.Is(err, isolation.ErrNoMachine):
		findings = append(findings, Finding{File: "machine " + slot, Field: "State", Value: "machined has no such machine", Want: "running"})
	case err != nil:
		return Result{Name: CheckMachine}, err
	case m.State != "running":
		findings = append(findings, Finding{File: "machine " + slot, Field: "State", Value: m.State, Want: "running"})
	}
	return result(CheckMachine, findings, fmt.Sprintf("slot %s: %s active, machine %s running (leader PID %d)", slot, unit, slot, m.Leader)), nil
}

// checkIdentity reads the kubelet's current client certificate from the
// identity directory and says how long it has left. The key in the same
// file is never printed.
func checkIdentity(root *hostroot.Root, now time.Time) Result {
	p, pair, err := nodeidentity.ReadPair(root, "")
	if errors.Is(err, nodeidentity.ErrNoIdentity) {
		return result(CheckIdentity, []Finding{{File: p, Field: "presence", Value: "missing", Want: "the kubelet's client certificate"}}, "")
	}
	if err != nil {
		return result(CheckIdentity, []Finding{{File: p, Field: "content", Value: err.Error()}}, "")
	}
	var cert *x509.Certificate
	for rest := pair; cert == nil; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return result(CheckIdentity, []Finding{{File: p, Field: "content", Value: "no CERTIFICATE block", Want: "a PEM certificate and key"}}, "")
		}
		if b.Type == "CERTIFICATE" {
			if cert, err = x509.ParseCertificate(b.Bytes); err != nil {
				return result(CheckIdentity, []Finding{{File: p, Field: "content", Value: "certificate: " + err.Error()}}, "")
			}
		}
	}
	var findings []Finding
	if now.After(cert.NotAfter) {
		findings = append(findings, Finding{File: p, Field: "notAfter", Value: cert.NotAfter.UTC().Format(time.RFC3339) + fmt.Sprintf(" (expired %s ago)", round(now.Sub(cert.NotAfter))), Want: "a time after now"})
	}
	if now.Before(cert.NotBefore) {
		findings = append(findings, Finding{File: p, Field: "notBefore", Value: cert.NotBefore.UTC().Format(time.RFC3339), Want: "a time before now (is the clock right?)"})
	}
	return result(CheckIdentity, findings, fmt.Sprintf("%s: %s, expires %s (in %s)", p, cert.Subject.CommonName,
		cert.NotAfter.UTC().Format(time.RFC3339), round(cert.NotAfter.Sub(now))))
}

// round shows a duration to the minute (to the second below one).
func round(d time.Duration) time.Duration {
	if d < time.Minute {
		return d.Round(time.Second)
	}
	return d.Round(time.Minute)
}
