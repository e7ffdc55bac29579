package transition_test

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/bootstrap"
	"github.com/kubeslot/kubeslot/lib/repave"
	"github.com/kubeslot/kubeslot/lib/reset"
	"github.com/kubeslot/kubeslot/lib/upgrade"
)

// diagram is the code block under "## State machines" in DESIGN.md.
func diagram(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../DESIGN.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), "\n## State machines\n")
	if !ok {
		t.Fatal(`DESIGN.md has no "## State machines" section`)
	}
	parts := strings.SplitN(after, "```", 3)
	if len(parts) < 3 {
		t.Fatal(`no code block under "## State machines"`)
	}
	return parts[1]
}

// chains returns the arrow chains (a ─▶ b ─▶ c) of stage's part of the
// diagram: the lines from one that starts with the stage's name at column 0
// to the next line at column 0. A line that starts with ─▶ continues the
// chain of the line before it; each name is the word next to its arrow
// (what follows it in parentheses or after a comma is commentary).
func chains(text, stage string) [][]string {
	var out [][]string
	in := false
	cur := -1
	for _, line := range strings.Split(text, "\n") {
		if line != "" && line[0] != ' ' {
			in = strings.HasPrefix(line, stage+" ")
			cur = -1
			continue
		}
		if !in {
			continue
		}
		if !strings.Contains(line, "─▶") {
			cur = -1
			continue
		}
		segs := strings.Split(line, "─▶")
		if strings.TrimSpace(segs[0]) != "" || cur < 0 {
			f := strings.Fields(segs[0])
			first := ""
			if len(f) > 0 {
				first = f[len(f)-1]
			}
			out = append(out, []string{first})
			cur = len(out) - 1
		}
		for _, s := range segs[1:] {
			name := ""
			if f := strings.Fields(s); len(f) > 0 {
				name = strings.TrimRight(f[0], ",")
			}
			out[cur] = append(out[cur], name)
		}
	}
	return out
}

// check says whether a chain of stage's part of the diagram is want.
func check(text, stage string, want []string) error {
	got := chains(text, stage)
	if slices.ContainsFunc(got, func(c []string) bool { return slices.Equal(c, want) }) {
		return nil
	}
	return fmt.Errorf("DESIGN.md's %s diagram has no chain %s; its chains: %q", stage, strings.Join(want, " ─▶ "), got)
}

func names(steps []reset.Step) []string {
	var out []string
	for _, s := range steps {
		out = append(out, s.Name)
	}
	return out
}

// wants are the chains the diagram must show, from the stages' tables.
func wants() map[string][][]string {
	boot := append(append([]string{"admitted"}, bootstrap.PhaseNames()...), "complete")
	rp := repave.PhaseChains()
	return map[string][][]string{
		"bootstrap": {boot},
		// The forward chain ends Succeeded, the rollback's Failed.
		"repave": {append(rp[0], "Succeeded"), append(rp[1], "Failed")},
		// The rollback is one phase: no chain to draw.
		"upgrade": {upgrade.PhaseChains()[0]},
		"reset":   {names(reset.StepsFor(false)), names(reset.StepsFor(true))},
	}
}

// TestDesignDiagramNamesThePhases: DESIGN.md's state-machine diagram names
// the phases of the stages' tables, in their order.
func TestDesignDiagramNamesThePhases(t *testing.T) {
	text := diagram(t)
	for stage, ws := range wants() {
		for _, w := range ws {
			if err := check(text, stage, w); err != nil {
				t.Error(err)
			}
		}
	}
}

// TestDesignCheckFails: the check fails when a phase is renamed on one side
// only, or two phases are swapped.
func TestDesignCheckFails(t *testing.T) {
	text := diagram(t)
	for stage, ws := range wants() {
		for _, w := range ws {
			last := w[len(w)-2]
			// Renamed in the diagram only.
			if err := check(strings.ReplaceAll(text, " "+last+" ", " "+last+"-renamed "), stage, w); err == nil {
				t.Errorf("%s: %s renamed in the diagram only passes", stage, last)
			}
			// Renamed in the table only.
			renamed := slices.Clone(w)
			renamed[len(w)-2] = last + "-renamed"
			if err := check(text, stage, renamed); err == nil {
				t.Errorf("%s: %s renamed in the table only passes", stage, last)
			}
			// Two phases swapped in the table.
			swapped := slices.Clone(w)
			swapped[1], swapped[2] = swapped[2], swapped[1]
			if err := check(text, stage, swapped); err == nil {
				t.Errorf("%s: %s and %s swapped passes", stage, w[1], w[2])
			}
		}
	}
}
