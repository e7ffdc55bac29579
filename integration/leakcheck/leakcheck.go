// Package leakcheck takes snapshots of what kubeslot and its test rig could leave behind on the machine running the
// tests, and diffs them: mounts, cgroup dirs, firewall rules, the sysctls kubelet touches, kubelet/containerd/
// systemd paths, network links and rig-looking processes. A test takes one snapshot before it changes the machine
// and one after cleaning up; any difference is a leak. It also holds the machine lock (lock.go) that keeps
// concurrently running test binaries out of each other's snapshots. Only test code (integration/...) may import it.
package leakcheck

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Snapshot is the state of the machine at one moment. Slices are sorted; equal machines give equal snapshots.
type Snapshot struct {
	Taken   time.Time
	Mounts  []string          // "mountpoint fstype source" of this process's mount namespace
	Cgroups []string          // cgroup dirs below /sys/fs/cgroup, to depth 4, every hierarchy
	Rules   map[string]string // tool -> normalized output of iptables-save, ip6tables-save, nft list ruleset
	Sysctls map[string]string // name -> value; "absent" when the file does not exist
	Trees   map[string][]string
	Links   []string // "name type address" of the network devices
	Procs   []string // "comm: cmdline" of processes that look like rig, kube or systemd leftovers
}

// Paths whose existence and contents are recorded, with the walk depth. Anything a kubelet, containerd, nspawn or
// kubeslot itself creates on a host; none of them may change on the machine running the tests.
var trees = map[string]int{
	"/etc/systemd":            4,
	"/var/lib/kubelet":        3,
	"/usr/libexec/kubernetes": 3,
	"/run/nri":                3,
	"/etc/kubernetes":         3,
	"/etc/containerd":         2,
	"/var/lib/containerd":     2,
	"/run/containerd":         2,
	"/etc/cni/net.d":          2,
	"/var/lib/machines":       2,
	"/run/systemd":            2,
	"/opt/kubeslot":           3,
	"/root/.kube":             2,
	"/var/log/pods":           2,
}

var sysctls = []string{
	"vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops", "kernel.keys.root_maxkeys",
	"kernel.keys.root_maxbytes", "net.ipv4.ip_forward", "net.bridge.bridge-nf-call-iptables",
}

var ruleTools = map[string][]string{
	"iptables-save":  {"iptables-save"},
	"ip6tables-save": {"ip6tables-save"},
	"nft":            {"nft", "list", "ruleset"},
}

// Take snapshots the machine. It costs a few hundred milliseconds: three rule dumps (forks) and two process scans.
func Take() (*Snapshot, error) {
	s := &Snapshot{Taken: time.Now(), Rules: map[string]string{}, Sysctls: map[string]string{}, Trees: map[string][]string{}}
	var errs []error
	procs1 := scanProcs() // first scan; see stableProcs
	var err error
	if s.Mounts, err = mounts(); err != nil {
		errs = append(errs, err)
	}
	s.Cgroups = cgroupDirs("/sys/fs/cgroup", 4)
	for name, argv := range ruleTools {
		s.Rules[name] = dumpRules(argv)
	}
	for _, k := range sysctls {
		data, err := os.ReadFile("/proc/sys/" + strings.ReplaceAll(k, ".", "/"))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			s.Sysctls[k] = "absent"
		case err != nil:
			s.Sysctls[k] = "error: " + err.Error()
		default:
			s.Sysctls[k] = strings.TrimSpace(string(data))
		}
	}
	for root, depth := range trees {
		s.Trees[root] = listTree(root, depth)
	}
	s.Links = links()
	time.Sleep(100 * time.Millisecond) // let a first-scan process that was only passing through finish
	s.Procs = stableProcs(procs1, scanProcs())
	return s, errors.Join(errs...)
}

// Diff lists, one line each, what differs between two snapshots; nil when they are equal.
func Diff(before, after *Snapshot) []string {
	var out []string
	out = append(out, diffLists("mount", before.Mounts, after.Mounts)...)
	out = append(out, diffLists("cgroup dir", before.Cgroups, after.Cgroups)...)
	for _, name := range sortedKeys(before.Rules, after.Rules) {
		out = append(out, diffLists(name+" line", lines(before.Rules[name]), lines(after.Rules[name]))...)
	}
	for _, k := range sortedKeys(before.Sysctls, after.Sysctls) {
		if before.Sysctls[k] != after.Sysctls[k] {
			out = append(out, fmt.Sprintf("sysctl %s changed: %q -> %q", k, before.Sysctls[k], after.Sysctls[k]))
		}
	}
	for _, root := range sortedKeys(before.Trees, after.Trees) {
		out = append(out, diffLists("path", before.Trees[root], after.Trees[root])...)
	}
	out = append(out, diffLists("network link", before.Links, after.Links)...)
	out = append(out, diffLists("process", before.Procs, after.Procs)...)
	return out
}

// diffLists compares two sorted lists as multisets.
func diffLists(what string, a, b []string) []string {
	count := map[string]int{}
	for _, x := range a {
		count[x]--
	}
	for _, x := range b {
		count[x]++
	}
	var out []string
	for _, k := range sortedKeys(count) {
		switch n := count[k]; {
		case n > 0:
			out = append(out, fmt.Sprintf("%s added (%d): %s", what, n, k))
		case n < 0:
			out = append(out, fmt.Sprintf("%s removed (%d): %s", what, -n, k))
		}
	}
	return out
}

func sortedKeys[V any](maps ...map[string]V) []string {
	seen := map[string]bool{}
	var keys []string
	for _, m := range maps {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	sort.Strings(keys)
	return keys
}

func lines(s string) []string {
	if s == "" {
		return nil
	}
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	sort.Strings(l)
	return l
}

func mounts() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("leakcheck: %w", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if len(fields) < 5 || sep < 0 || sep+2 >= len(fields) {
			continue
		}
		out = append(out, fields[4]+" "+fields[sep+1]+" "+fields[sep+2])
	}
	sort.Strings(out)
	return out, sc.Err()
}

// noisyCgroupParents: the CI machines' supervisor (/process_api) makes one memory cgroup per command it runs
// (the test runner's, the lead's shell, ...); their children come and go with no relation to the tests.
var noisyCgroupParents = map[string]bool{"process_api": true}

func cgroupDirs(root string, depth int) []string {
	var out []string
	var walk func(dir string, d int)
	walk = func(dir string, d int) {
		if d > depth || noisyCgroupParents[filepath.Base(dir)] {
			return
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			return
		}
		for _, e := range entries {
			if e.IsDir() {
				p := filepath.Join(dir, e.Name())
				out = append(out, p)
				walk(p, d+1)
			}
		}
	}
	walk(root, 1)
	sort.Strings(out)
	return out
}

var (
	counters    = regexp.MustCompile(`\[\d+:\d+\]`)
	nftCounters = regexp.MustCompile(`packets \d+ bytes \d+`)
)

// dumpRules runs a rule dump and strips what changes without anyone changing the rules: comments with timestamps,
// packet counters.
func dumpRules(argv []string) string {
	path, err := exec.LookPath(argv[0])
	if err != nil {
		for _, d := range []string{"/usr/sbin", "/sbin"} {
			if _, serr := os.Stat(filepath.Join(d, argv[0])); serr == nil {
				path, err = filepath.Join(d, argv[0]), nil
				break
			}
		}
	}
	if err != nil {
		return "(not installed)"
	}
	out, err := exec.Command(path, argv[1:]...).CombinedOutput()
	var b strings.Builder
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "#") || strings.TrimSpace(l) == "" {
			continue
		}
		l = counters.ReplaceAllString(l, "[0:0]")
		l = nftCounters.ReplaceAllString(l, "packets 0 bytes 0")
		b.WriteString(l + "\n")
	}
	if err != nil {
		b.WriteString("(exit: " + err.Error() + ")\n")
	}
	return b.String()
}

// listTree records existence, files (size, mode, mtime), dirs and symlinks below root, to depth levels.
func listTree(root string, depth int) []string {
	if _, err := os.Lstat(root); err != nil {
		return []string{root + " absent"}
	}
	var out []string
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			out = append(out, p+" unreadable")
			return nil
		}
		if rel, _ := filepath.Rel(root, p); rel != "." && strings.Count(rel, "/")+1 > depth {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			out = append(out, p+" -> "+target)
		case d.IsDir():
			out = append(out, p+"/ "+info.Mode().String())
		default:
			out = append(out, fmt.Sprintf("%s %s size=%d mtime=%s", p, info.Mode(), info.Size(),
				info.ModTime().UTC().Format(time.RFC3339Nano)))
		}
		return nil
	})
	sort.Strings(out)
	return out
}

// links lists the network devices of this network namespace (sysfs, no fork).
func links() []string {
	entries, err := os.ReadDir("/sys/class/net")
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	var out []string
	for _, e := range entries {
		read := func(f string) string {
			data, _ := os.ReadFile(filepath.Join("/sys/class/net", e.Name(), f))
			return strings.TrimSpace(string(data))
		}
		out = append(out, e.Name()+" type="+read("type")+" addr="+read("address"))
	}
	sort.Strings(out)
	return out
}

// Check compares the machine with before until they are equal or ctx ends, and returns the last difference (nil:
// no leak). Retrying lets unrelated activity that was passing through settle (a process spawned by another job
// between the two scans); a real leak stays. Tests that must catch slow cleanup should look at Diff of one Take
// for their own names first.
func Check(ctx context.Context, before *Snapshot) ([]string, error) {
	for {
		after, err := Take()
		if err != nil {
			return nil, err
		}
		d := Diff(before, after)
		if len(d) == 0 {
			return nil, nil
		}
		select {
		case <-ctx.Done():
			return d, nil
		case <-time.After(500 * time.Millisecond):
		}
	}
}
