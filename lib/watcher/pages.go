package watcher

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The watcher's resident memory is mostly its own binary: code and
// read-only data mapped from the file, some 15 MB of a 24 MB binary, where
// its heap is under 5 MB. Start-up (the CLI, the configuration, the
// installation lock, the lifecycle hooks over D-Bus, TLS, the first lists
// and the Machine's registration) touches code all over the binary, and the
// kernel maps 64 KiB around each page touched; an idle watcher runs a small
// part of it (its watches, timers, the garbage collector). So, once the
// start-up is over, the binary asks the kernel to page its read-only
// mappings out (MADV_PAGEOUT, Linux 5.4): what it still runs comes back on
// first use, from the page cache or the disk, and the rest leaves memory. Pages another process maps too are left alone by the
// kernel. The mappings are marked random access first (MADV_RANDOM): a page
// that comes back is read alone, without the readahead window around it,
// so the fault-around that follows finds no neighbours in the page cache
// to map (on the rig: 10 MiB of the binary resident when idle, 6.6 MiB with
// it).

// ReleaseAfter is how long after the first sync the start-up pages are
// released: the first decision (registration, a status write) is over by
// then.
const releaseAfter = 10 * time.Second

var releaseOnce sync.Once

// releaseStartupPages releases the binary's start-up pages once per process;
// a failure (an old kernel) is logged and changes nothing else.
func releaseStartupPages(log *slog.Logger) {
	releaseOnce.Do(func() {
		n, err := releaseImagePages()
		if err != nil {
			log.Info("cannot release the start-up code's pages; the watcher keeps them resident", "err", err.Error())
			return
		}
		log.Info("released the start-up code's pages", "mapped_bytes", n)
	})
}

// releaseImagePages pages out the read-only mappings of the running binary
// (its code and read-only data) and returns their size.
func releaseImagePages() (int, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return 0, err
	}
	maps, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, err
	}
	defer maps.Close()
	total := 0
	sc := bufio.NewScanner(maps)
	for sc.Scan() {
		lo, hi, ok := imageMapping(sc.Text(), exe)
		if !ok {
			continue
		}
		// Random access first: a page the idle watcher runs again is then
		// read alone, not with the readahead window around it, which the
		// fault-around would map too.
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, lo, hi-lo, unix.MADV_RANDOM); errno != 0 {
			return total, fmt.Errorf("madvise(MADV_RANDOM) %#x-%#x of %s: %w", lo, hi, exe, errno)
		}
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, lo, hi-lo, unix.MADV_PAGEOUT); errno != 0 {
			return total, fmt.Errorf("madvise(MADV_PAGEOUT) %#x-%#x of %s: %w", lo, hi, exe, errno)
		}
		total += int(hi - lo)
	}
	if err := sc.Err(); err != nil {
		return total, fmt.Errorf("/proc/self/maps: %w", err)
	}
	if total == 0 {
		return 0, errors.New("/proc/self/maps: no read-only mapping of " + exe)
	}
	return total, nil
}

// imageMapping parses one line of /proc/self/maps ("lo-hi perms offset dev
// inode path") and says whether it maps exe read-only.
func imageMapping(line, exe string) (lo, hi uintptr, ok bool) {
	f := strings.Fields(line)
	if len(f) < 6 || strings.Join(f[5:], " ") != exe || strings.Contains(f[1], "w") {
		return 0, 0, false
	}
	a, b, found := strings.Cut(f[0], "-")
	if !found {
		return 0, 0, false
	}
	l, err1 := strconv.ParseUint(a, 16, 64)
	h, err2 := strconv.ParseUint(b, 16, 64)
	if err1 != nil || err2 != nil || h <= l {
		return 0, 0, false
	}
	return uintptr(l), uintptr(h), true
}
