// Package window is the arithmetic of maintenance windows: recurring spans
// of local time (days of the week, a start, a duration, an IANA time zone)
// in which an agent may start disruptive work. It is pure (no clock, no
// I/O) so that the daylight-saving, midnight and time-zone cases are unit
// tested. Imported by lib/api/v1alpha1's helpers and lib/watcher; a binary
// that parses windows embeds time/tzdata, as the host may have no zone
// database.
package window

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"time"
)

// MaxLength bounds a window's duration: a week, so that finding the
// windows open at a time looks back no further than eight days.
const MaxLength = 7 * 24 * time.Hour

// Window is one parsed maintenance window.
type Window struct {
	// Days it opens on; empty: every day.
	Days []time.Weekday
	// Hour and Minute of local time it opens at.
	Hour, Minute int
	// Length is how long it stays open, in elapsed time (a window across a
	// daylight-saving change lasts Length, not Length of wall clock).
	Length time.Duration
	// Loc is its time zone.
	Loc *time.Location
}

var days = map[string]time.Weekday{"Sun": time.Sunday, "Mon": time.Monday, "Tue": time.Tuesday,
	"Wed": time.Wednesday, "Thu": time.Thursday, "Fri": time.Friday, "Sat": time.Saturday}

var hhmm = regexp.MustCompile(`^([01][0-9]|2[0-3]):([0-5][0-9])$`)

// Parse reads one window: days ("Mon".."Sun"; none: every day), start
// ("HH:MM", 24-hour local time), length (a Go duration, 1m to 168h) and
// zone (an IANA name; "": UTC). An error names the field (as given in
// field, e.g. "spec.rollout.windows[0]") and the value.
func Parse(field string, dayNames []string, start, length, zone string) (Window, error) {
	var w Window
	for i, d := range dayNames {
		wd, ok := days[d]
		if !ok {
			return w, fmt.Errorf("%s.days[%d] %q: want one of Mon, Tue, Wed, Thu, Fri, Sat, Sun", field, i, d)
		}
		w.Days = append(w.Days, wd)
	}
	m := hhmm.FindStringSubmatch(start)
	if m == nil {
		return w, fmt.Errorf("%s.start %q: want HH:MM, 24-hour local time, e.g. 02:00", field, start)
	}
	w.Hour, _ = strconv.Atoi(m[1])
	w.Minute, _ = strconv.Atoi(m[2])
	l, err := time.ParseDuration(length)
	if err != nil || l < time.Minute || l > MaxLength {
		return w, fmt.Errorf("%s.duration %q: want a duration from 1m to 168h, e.g. 4h or 90m", field, length)
	}
	w.Length = l
	// "Local" would be the host's zone: each agent would read the
	// window differently.
	if zone == "Local" {
		return w, fmt.Errorf("%s.timeZone %q: want an IANA time zone name, e.g. Europe/Berlin (the host's own zone is not one)", field, zone)
	}
	if w.Loc, err = time.LoadLocation(zone); err != nil {
		return w, fmt.Errorf("%s.timeZone %q: not an IANA time zone name, e.g. Europe/Berlin or UTC", field, zone)
	}
	return w, nil
}

// opens is when w opens on the local date of day (valid or not).
func (w Window) opens(y int, mo time.Month, d int) (time.Time, bool) {
	t := time.Date(y, mo, d, w.Hour, w.Minute, 0, 0, w.Loc)
	if len(w.Days) > 0 && !slices.Contains(w.Days, t.Weekday()) {
		return t, false
	}
	return t, true
}

// State says whether any of ws is open at t and when that changes: with
// open, when the last of the windows open at t closes; without, when the
// next opens (zero when none ever does, as with no windows).
func State(ws []Window, t time.Time) (open bool, change time.Time) {
	var closes, next time.Time
	for _, w := range ws {
		local := t.In(w.Loc)
		y, mo, d := local.Date()
		// A window that opened up to MaxLength ago, on any day since, may
		// still be open; the next opening is within the coming week.
		for back := -8; back <= 8; back++ {
			start, ok := w.opens(y, mo, d+back)
			if !ok {
				continue
			}
			end := start.Add(w.Length)
			switch {
			case !start.After(t) && t.Before(end):
				if end.After(closes) {
					closes = end
				}
			case start.After(t):
				if next.IsZero() || start.Before(next) {
					next = start
				}
			}
		}
	}
	if !closes.IsZero() {
		return true, closes
	}
	return false, next
}
