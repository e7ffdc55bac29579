package rolloutview

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// barWidth is the progress bar's width in characters.
const barWidth = 30

// WriteStatus writes the per-machine table, the progress bar and the
// outcome line. Node-written text is made terminal-safe and cut short.
func (v View) WriteStatus(w io.Writer) error {
	head := fmt.Sprintf("MachineOperation %s (%s", plain(v.Name, 253), v.Type)
	if v.Rollout != "" {
		head += "; rollout " + v.Rollout
	}
	head += ")\n"
	if _, err := io.WriteString(w, head); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MACHINE\tPHASE\tSTEP\tIN STEP\tTOTAL\tMESSAGE")
	for _, r := range v.Rows {
		step, since := r.Step()
		phase := string(r.Phase)
		if phase == "" {
			phase = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", plain(r.Machine, 63), phase, plain(step, 40),
			v.ago(since), v.total(r), plain(r.Message, 72))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n", v.bar())
	if v.Ignored > 0 {
		fmt.Fprintf(&b, "%d entries not counted: no Machine of that name and node that the operation targets\n", v.Ignored)
	}
	fmt.Fprintf(&b, "Outcome: %s\n", v.Summary())
	_, err := io.WriteString(w, b.String())
	return err
}

// bar is the progress of the whole operation: the finished share of the
// targets, succeeded as '#', failed as 'x'.
func (v View) bar() string {
	n := len(v.Rows)
	done, failed := int(v.Status.Done), int(v.Status.Failed)
	if n == 0 {
		return "[" + strings.Repeat("-", barWidth) + "] no targets"
	}
	ok := done * barWidth / n
	bad := (done + failed) * barWidth / n
	if failed > 0 && bad == ok {
		bad = min(ok+1, barWidth)
	}
	ok = min(ok, bad)
	return fmt.Sprintf("[%s%s%s] %3d%%  %d/%d finished", strings.Repeat("#", ok), strings.Repeat("x", bad-ok),
		strings.Repeat("-", barWidth-bad), (done+failed)*100/n, done+failed, n)
}

func (v View) ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return Duration(v.Now.Sub(t))
}

// total is how long the target took (finished) or has taken so far.
func (v View) total(r Row) string {
	switch {
	case r.Start.IsZero():
		return "-"
	case !r.End.IsZero():
		return Duration(r.End.Sub(r.Start))
	}
	return Duration(v.Now.Sub(r.Start))
}
