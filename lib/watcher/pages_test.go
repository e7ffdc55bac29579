package watcher

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestImageMapping(t *testing.T) {
	for _, tc := range []struct {
		line   string
		ok     bool
		lo, hi uintptr
	}{
		{"00400000-00b78000 r-xp 00000000 fd:00 123 /opt/kubeslot/current/kubeslot-watcher", true, 0x400000, 0xb78000},
		{"00b78000-0139b000 r--p 00778000 fd:00 123 /opt/kubeslot/current/kubeslot-watcher", true, 0xb78000, 0x139b000},
		{"0139b000-01411000 rw-p 00f9b000 fd:00 123 /opt/kubeslot/current/kubeslot-watcher", false, 0, 0}, // data
		{"7f00-7f10 r--p 00000000 fd:00 9 /usr/lib/libc.so.6", false, 0, 0},
		{"c000000000-c000400000 rw-p 00000000 00:00 0", false, 0, 0},
		{"zz-00b78000 r-xp 00000000 fd:00 123 /opt/kubeslot/current/kubeslot-watcher", false, 0, 0},
	} {
		lo, hi, ok := imageMapping(tc.line, "/opt/kubeslot/current/kubeslot-watcher")
		if ok != tc.ok || lo != tc.lo || hi != tc.hi {
			t.Errorf("imageMapping(%q) = %#x, %#x, %v; want %#x, %#x, %v", tc.line, lo, hi, ok, tc.lo, tc.hi, tc.ok)
		}
	}
}

// TestReleaseImagePages releases this test binary's pages: its resident
// file pages must drop (they come back as the test runs on).
func TestReleaseImagePages(t *testing.T) {
	before := rssFile(t)
	n, err := releaseImagePages()
	if errors.Is(err, unix.EINVAL) {
		t.Skipf("the kernel has no MADV_PAGEOUT: %v", err)
	}
	if err != nil || n == 0 {
		t.Fatalf("releaseImagePages() = %d, %v", n, err)
	}
	after := rssFile(t)
	t.Logf("RssFile %d kB before, %d kB after releasing %d bytes of mappings", before, after, n)
	if after >= before {
		t.Errorf("RssFile %d kB after the release, %d kB before: nothing left memory", after, before)
	}
}

func rssFile(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "RssFile:"); ok {
			f := strings.Fields(v)
			n, err := strconv.Atoi(f[0])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no RssFile in /proc/self/status")
	return 0
}
