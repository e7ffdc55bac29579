// Package mountinfo reads this process's mount table (/proc/self/mountinfo),
// so that code about to remove a tree can first refuse one that still has
// something mounted inside: removing through a live mount would delete the
// mounted filesystem's files. Imported by lib/ packages and rig code that
// remove directory trees.
package mountinfo

import (
	"bufio"
	"io"
	"os"
	"strconv"
	"strings"
)

// Under lists the mount points of this mount namespace at or below dir (an
// absolute, clean path).
func Under(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return under(f, dir)
}

func under(r io.Reader, dir string) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// ID parentID major:minor root mountpoint options ...
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := Unescape(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") || dir == "/" {
			out = append(out, mp)
		}
	}
	return out, sc.Err()
}

// Unescape undoes mountinfo's octal escapes (\040 for a space, \011 for a
// tab, \012 for a newline, \134 for a backslash).
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
