package window

import (
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // the tests must not depend on the host's zone database
)

func mustParse(t *testing.T, days []string, start, length, zone string) Window {
	t.Helper()
	w, err := Parse("w", days, start, length, zone)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func at(t *testing.T, zone, s string) time.Time {
	t.Helper()
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	v, err := time.ParseInLocation("2006-01-02 15:04", s, loc)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestState(t *testing.T) {
	// 2026-12-04 is a Friday.
	nightly := mustParse(t, []string{"Fri"}, "22:00", "4h", "Europe/Berlin")
	cases := []struct {
		name   string
		ws     []Window
		now    time.Time
		open   bool
		change time.Time
	}{
		{"before the window: opens tonight", []Window{nightly}, at(t, "Europe/Berlin", "2026-12-04 21:59"), false,
			at(t, "Europe/Berlin", "2026-12-04 22:00")},
		{"at its start: open", []Window{nightly}, at(t, "Europe/Berlin", "2026-12-04 22:00"), true,
			at(t, "Europe/Berlin", "2026-12-05 02:00")},
		{"past midnight, the next day: still open", []Window{nightly}, at(t, "Europe/Berlin", "2026-12-05 01:59"), true,
			at(t, "Europe/Berlin", "2026-12-05 02:00")},
		{"at its end: closed until next Friday", []Window{nightly}, at(t, "Europe/Berlin", "2026-12-05 02:00"), false,
			at(t, "Europe/Berlin", "2026-12-11 22:00")},
		{"another zone's clock: the same instants", []Window{nightly}, at(t, "America/New_York", "2026-12-04 16:30"), true,
			at(t, "Europe/Berlin", "2026-12-05 02:00")},
		{"every day", []Window{mustParse(t, nil, "03:00", "1h", "UTC")}, at(t, "UTC", "2026-12-06 04:00"), false,
			at(t, "UTC", "2026-12-07 03:00")},
		{"a weekend-long window", []Window{mustParse(t, []string{"Sat"}, "00:00", "48h", "UTC")}, at(t, "UTC", "2026-12-06 23:00"),
			true, at(t, "UTC", "2026-12-07 00:00")},
		{"two windows: the earlier next one", []Window{nightly, mustParse(t, []string{"Tue"}, "12:00", "1h", "Asia/Tokyo")},
			at(t, "UTC", "2026-12-05 12:00"), false, at(t, "Asia/Tokyo", "2026-12-08 12:00")},
		{"overlapping windows: open until the later end", []Window{mustParse(t, nil, "01:00", "2h", "UTC"),
			mustParse(t, nil, "02:00", "3h", "UTC")}, at(t, "UTC", "2026-12-06 02:30"), true, at(t, "UTC", "2026-12-06 05:00")},
		{"no windows: never open", nil, at(t, "UTC", "2026-12-06 02:30"), false, time.Time{}},
		// Berlin springs forward on 2026-03-29: 02:00 becomes 03:00.
		{"DST spring: a window in the skipped hour opens all the same", []Window{mustParse(t, []string{"Sun"}, "02:30", "1h", "Europe/Berlin")},
			at(t, "UTC", "2026-03-29 00:59"), false, at(t, "UTC", "2026-03-29 00:30").Add(time.Hour)},
		{"DST spring: the duration is elapsed time", []Window{mustParse(t, []string{"Sun"}, "01:00", "3h", "Europe/Berlin")},
			at(t, "Europe/Berlin", "2026-03-29 04:30"), true, at(t, "Europe/Berlin", "2026-03-29 05:00")},
		// Berlin falls back on 2026-10-25: 03:00 becomes 02:00 again.
		{"DST autumn: the duration is elapsed time", []Window{mustParse(t, []string{"Sun"}, "01:00", "3h", "Europe/Berlin")},
			at(t, "UTC", "2026-10-25 01:30"), true, at(t, "UTC", "2026-10-25 02:00")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			open, change := State(tc.ws, tc.now)
			if open != tc.open || !change.Equal(tc.change) {
				t.Errorf("State at %v: open %v, change %v; want %v, %v", tc.now, open, change, tc.open, tc.change)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		days                []string
		start, length, zone string
		want                string
	}{
		{[]string{"Monday"}, "02:00", "1h", "", `w.days[0] "Monday"`},
		{nil, "2:00", "1h", "", `w.start "2:00"`},
		{nil, "24:00", "1h", "", `w.start "24:00"`},
		{nil, "02:00", "four hours", "", `w.duration "four hours"`},
		{nil, "02:00", "30s", "", `w.duration "30s"`},
		{nil, "02:00", "169h", "", `w.duration "169h"`},
		{nil, "02:00", "1h", "Mars/Olympus", `w.timeZone "Mars/Olympus"`},
		{nil, "02:00", "1h", "Local", `w.timeZone "Local"`},
	}
	for _, tc := range cases {
		_, err := Parse("w", tc.days, tc.start, tc.length, tc.zone)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%v, %q, %q, %q): %v, want an error naming %s", tc.days, tc.start, tc.length, tc.zone, err, tc.want)
		}
	}
	w, err := Parse("w", []string{"Sat", "Sun"}, "23:59", "168h", "")
	if err != nil || w.Loc != time.UTC || len(w.Days) != 2 || w.Hour != 23 || w.Minute != 59 || w.Length != MaxLength {
		t.Errorf("a valid window: %+v, %v", w, err)
	}
}
