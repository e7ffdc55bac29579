// Package sdtest is the fake of kubeslot's systemd client
// (lib/systemdconn.Client) for unit tests: a host systemd with machined in
// memory that keeps unit states and machines and records every call that
// changes something, and every listing; a call may be made to fail.
// Imported by tests only.
package sdtest

import (
	"context"
	"fmt"
	"path"
	"slices"
	"sync"

	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
	"github.com/kubeslot/kubeslot/lib/systemdconn"
)

// Systemd is a fake host systemd with machined. Its exported fields may be
// set and read by the test between calls; calls are safe for concurrent
// use.
type Systemd struct {
	mu sync.Mutex
	// Units is each unit's ActiveState; a unit not in it is "inactive".
	Units map[string]string
	// Machines are machined's machines by name.
	Machines map[string]hostapi.Machine
	// Reloads counts daemon-reloads.
	Reloads int
	// MachineOf names the machine a unit runs, "" for none: starting (or
	// restarting) the unit registers that machine running, stopping the
	// unit unregisters it. Nil registers no machines.
	MachineOf func(unit string) string
	// StartErr and StopErr, when set, fail every StartUnit and StopUnit
	// (nothing changes).
	StartErr, StopErr error
	// Fail fails the one call a key names as Calls does ("stop U",
	// "terminate M", "list [P ...]") with its error: the call is recorded
	// and changes nothing.
	Fail map[string]error
	// NoBoot makes StartUnit succeed while the unit fails and no machine
	// appears.
	NoBoot bool
	// Leaders are the leader PIDs of the machines units register, by
	// machine name; 4242 for a name not in it.
	Leaders map[string]int
	calls   []string
}

// New returns a fake with no units and no machines; machineOf as in
// Systemd.MachineOf.
func New(machineOf func(unit string) string) *Systemd {
	return &Systemd{Units: map[string]string{}, Machines: map[string]hostapi.Machine{}, MachineOf: machineOf}
}

// The fake implements the real client's methods, so every consumer's
// interface.
var _ hostapi.Systemd = (*Systemd)(nil)

// record records call and returns the error Fail has for it.
func (f *Systemd) record(call string) error {
	f.calls = append(f.calls, call)
	return f.Fail[call]
}

// Calls returns the calls made so far, in order: "start U", "stop U",
// "restart U", "reload", "reset-failed U", "terminate M", "list [P ...]",
// and "halt M" (HaltLeader).
func (f *Systemd) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// ForgetCalls forgets the calls made so far.
func (f *Systemd) ForgetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = nil
}

func (f *Systemd) run(unit string) {
	f.Units[unit] = "active"
	if f.MachineOf == nil {
		return
	}
	if m := f.MachineOf(unit); m != "" {
		leader := f.Leaders[m]
		if leader == 0 {
			leader = 4242
		}
		f.Machines[m] = hostapi.Machine{Name: m, State: "running", Leader: leader, Class: "container", Service: unit}
	}
}

// HaltLeader is what the halt of a machine's init does: the machine whose
// leader is pid goes, and the unit that registered it stops (nspawn exits
// with its machine). It records "halt M".
func (f *Systemd) HaltLeader(pid int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for name, m := range f.Machines {
		if m.Leader != pid {
			continue
		}
		f.calls = append(f.calls, "halt "+name)
		if m.Service != "" {
			f.Units[m.Service] = "inactive"
		}
		delete(f.Machines, name)
	}
}

// StartUnit implements hostapi.Systemd.
func (f *Systemd) StartUnit(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("start " + name); err != nil {
		return err
	}
	if f.StartErr != nil {
		return f.StartErr
	}
	if f.NoBoot {
		f.Units[name] = "failed"
		return nil
	}
	f.run(name)
	return nil
}

// RestartUnit implements lib/upgrade.Systemd: the unit runs at once.
func (f *Systemd) RestartUnit(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("restart " + name); err != nil {
		return err
	}
	f.run(name)
	return nil
}

// StopUnit implements hostapi.Systemd.
func (f *Systemd) StopUnit(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("stop " + name); err != nil {
		return err
	}
	if f.StopErr != nil {
		return f.StopErr
	}
	f.Units[name] = "inactive"
	if f.MachineOf != nil {
		if m := f.MachineOf(name); m != "" {
			delete(f.Machines, m)
		}
	}
	return nil
}

// Reload implements hostapi.Systemd.
func (f *Systemd) Reload(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("reload"); err != nil {
		return err
	}
	f.Reloads++
	return nil
}

// state returns a unit's ActiveState and a SubState that goes with it.
func (f *Systemd) state(name string) (string, string) {
	s := f.Units[name]
	if s == "" {
		s = "inactive"
	}
	switch s {
	case "active":
		return s, "running"
	case "inactive":
		return s, "dead"
	}
	return s, s
}

// UnitState implements hostapi.Systemd.
func (f *Systemd) UnitState(_ context.Context, name string) (string, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	active, sub := f.state(name)
	return active, sub, nil
}

// ServiceStatus implements lib/upgrade.Systemd: the unit's states only.
func (f *Systemd) ServiceStatus(_ context.Context, name string) (systemdconn.ServiceStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	active, sub := f.state(name)
	return systemdconn.ServiceStatus{ActiveState: active, SubState: sub}, nil
}

// ResetFailed implements hostapi.Systemd.
func (f *Systemd) ResetFailed(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("reset-failed " + name); err != nil {
		return err
	}
	return nil
}

// ListUnitsByPatterns implements lib/reset.UnitLister: the units in Units
// matching a pattern, sorted.
func (f *Systemd) ListUnitsByPatterns(_ context.Context, patterns []string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record(fmt.Sprintf("list %v", patterns)); err != nil {
		return nil, err
	}
	var out []string
	for u := range f.Units {
		for _, p := range patterns {
			if ok, _ := path.Match(p, u); ok {
				out = append(out, u)
				break
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// Machine implements hostapi.Systemd.
func (f *Systemd) Machine(_ context.Context, name string) (hostapi.Machine, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.Machines[name]
	if !ok {
		return m, fmt.Errorf("machine %s: %w", name, hostapi.ErrNoMachine)
	}
	return m, nil
}

// TerminateMachine implements hostapi.Systemd: the machine goes, and the
// unit that registered it (Machine.Service) fails.
func (f *Systemd) TerminateMachine(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("terminate " + name); err != nil {
		return err
	}
	if m, ok := f.Machines[name]; ok && m.Service != "" {
		f.Units[m.Service] = "failed"
	}
	delete(f.Machines, name)
	return nil
}
