package leakcheck

import (
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Which processes count. Only those that look like the rig's, kube's or systemd's: a compile of the Kubernetes
// sources (argv[0] "compile", arguments naming kube-apiserver) or any other unrelated job must not trip the check,
// so names are matched on the executable (comm and argv[0]'s base name), never on arguments.
var (
	procPrefixes = []string{"systemd", "(sd-", "kubelet", "kubectl", "kubeslot", "kube-apiserver", "kube-controller",
		"kube-scheduler", "kube-proxy", "containerd", "etcd", "dbus-", "runc", "crio", "conmon"}
	procNames = map[string]bool{"unshare": true, "nsenter": true, "machinectl": true, "journalctl": true, "host-init.sh": true}
)

type procInfo struct {
	pid, ppid int
	start     string // start time in clock ticks since boot: with the pid, identifies the process
	comm      string
	cmdline   string
	pidNS     string
	cgroup    string
	kthread   bool
}

func (p procInfo) key() string { return strconv.Itoa(p.pid) + "@" + p.start }

func scanProcs() map[string]procInfo {
	entries, _ := os.ReadDir("/proc")
	out := make(map[string]procInfo, len(entries))
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, ok := readProc(pid); ok {
			out[p.key()] = p
		}
	}
	return out
}

func readProc(pid int) (procInfo, bool) {
	dir := "/proc/" + strconv.Itoa(pid)
	stat, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return procInfo{}, false
	}
	// pid (comm) state ppid ... : comm may hold spaces and parens, so split after the last ')'.
	s := string(stat)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return procInfo{}, false
	}
	f := strings.Fields(s[closing+1:]) // f[0] is field 3 (state)
	if len(f) < 20 {
		return procInfo{}, false
	}
	p := procInfo{pid: pid, comm: s[open+1 : closing], start: f[19]}
	p.ppid, _ = strconv.Atoi(f[1])
	flags, _ := strconv.ParseUint(f[6], 10, 64)
	p.kthread = flags&0x00200000 != 0 || pid == 2 || p.ppid == 2 // PF_KTHREAD
	if p.kthread {
		return p, true
	}
	cmd, _ := os.ReadFile(dir + "/cmdline")
	p.cmdline = strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))
	p.pidNS, _ = os.Readlink(dir + "/ns/pid")
	cg, _ := os.ReadFile(dir + "/cgroup")
	p.cgroup = string(cg)
	return p, true
}

// stableProcs keeps the interesting processes present in both scans (same pid and start time), excluding the
// snapshotting process and its ancestors (go test, shells) but not its descendants: a host the test started is
// exactly what must be gone after cleanup.
func stableProcs(first, second map[string]procInfo) []string {
	self := os.Getpid()
	ancestors := map[int]bool{}
	for pid := self; pid > 1; {
		ancestors[pid] = true
		p, ok := readProc(pid)
		if !ok {
			break
		}
		pid = p.ppid
	}
	myNS, _ := os.Readlink("/proc/self/ns/pid")
	var out []string
	for k, p := range second {
		if _, ok := first[k]; !ok || p.kthread || ancestors[p.pid] || !interesting(p, myNS) {
			continue
		}
		cmd := p.cmdline
		if len(cmd) > 200 {
			cmd = cmd[:200] + "..."
		}
		out = append(out, p.comm+": "+cmd)
	}
	sort.Strings(out)
	return out
}

func interesting(p procInfo, myNS string) bool {
	if p.pidNS != "" && myNS != "" && p.pidNS != myNS { // inside some container or rig host
		return true
	}
	if strings.Contains(p.cgroup, "/kubeslot-rig/") {
		return true
	}
	names := []string{p.comm}
	if argv0, _, _ := strings.Cut(p.cmdline, " "); argv0 != "" {
		names = append(names, filepath.Base(argv0))
	}
	for _, n := range names {
		if procNames[n] {
			return true
		}
		for _, pre := range procPrefixes {
			if strings.HasPrefix(n, pre) {
				return true
			}
		}
	}
	return false
}
