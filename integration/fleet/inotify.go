package fleet

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

const inotifyInstances = "/proc/sys/fs/inotify/max_user_instances"

// RaiseInotifyInstances makes room for extra inotify instances of this user: every agent watches its host root with
// fsnotify, one instance each, and the kernel allows 128 per user by default (a real fleet has one kernel per
// agent). It raises fs.inotify.max_user_instances only when the instances open now plus extra (and a margin for
// others on the machine) would not fit, and returns the function that puts the old value back (a no-op when nothing
// was raised, or when someone changed the value since). Call it after the agents stopped.
func RaiseInotifyInstances(extra int) (restore func() error, err error) {
	noop := func() error { return nil }
	limit, err := readInt(inotifyInstances)
	if err != nil {
		return noop, err
	}
	need := openInotify() + extra + 64
	if need <= limit {
		return noop, nil
	}
	if err := os.WriteFile(inotifyInstances, []byte(strconv.Itoa(need)), 0o644); err != nil {
		return noop, fmt.Errorf("raise %s from %d to %d for %d agents: %w", inotifyInstances, limit, need, extra, err)
	}
	return func() error {
		if now, err := readInt(inotifyInstances); err != nil || now != need {
			return err // changed by someone else since: theirs now
		}
		if err := os.WriteFile(inotifyInstances, []byte(strconv.Itoa(limit)), 0o644); err != nil {
			return fmt.Errorf("restore %s to %d: %w", inotifyInstances, limit, err)
		}
		return nil
	}, nil
}

func readInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("%s: %q: %w", path, b, err)
	}
	return n, nil
}

// openInotify counts the inotify instances open on the machine (all users: an upper bound for this one's).
func openInotify() int {
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	n := 0
	for _, fd := range fds {
		if l, err := os.Readlink(fd); err == nil && l == "anon_inode:inotify" {
			n++
		}
	}
	return n
}
