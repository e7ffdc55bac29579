package sdhost

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// v1Controllers are the cgroup v1 controllers a V1Controllers host gets: the ones containerd, runc and a kubelet use
// on a v1 machine. Each must be bound to a v1 hierarchy of its own on the machine (cpu and cpuacct separately), as
// host-init.sh mounts them one by one.
var v1Controllers = []string{"blkio", "cpu", "cpuacct", "cpuset", "devices", "freezer", "memory", "pids"}

// v1Dir is a host's dir in one v1 controller hierarchy of the machine.
type v1Dir struct {
	controller string
	mount      string // the machine's mount of the hierarchy: /sys/fs/cgroup/<controller>
	dir        string // <mount><cgroup of this process>/kubeslot-rig/<name>
}

// V1ControllersAvailable reports whether hosts with Options.V1Controllers can run here: nil, or the reason to print
// when skipping. They need a hybrid machine whose v1 controllers each have a hierarchy of their own.
func V1ControllersAvailable() error {
	if layout, err := machineLayout(); err != nil {
		return err
	} else if layout != "hybrid" {
		return fmt.Errorf("V1Controllers needs a hybrid machine (cgroup v1 controllers); this one is %s", layout)
	}
	_, err := v1Dirs("probe")
	return err
}

// v1Dirs are the host's dirs in the machine's v1 controller hierarchies. Each sits below the cgroup this process is
// in, so whatever limit the machine puts on the test (memory above all) binds its hosts too.
func v1Dirs(name string) ([]v1Dir, error) {
	own, err := ownV1Cgroups()
	if err != nil {
		return nil, err
	}
	var out []v1Dir
	var errs []error
	for _, c := range v1Controllers {
		p, ok := own[c]
		if !ok {
			errs = append(errs, fmt.Errorf("controller %s is not bound to a v1 hierarchy of its own on this machine (/proc/self/cgroup)", c))
			continue
		}
		mount := filepath.Join("/sys/fs/cgroup", c)
		var st syscall.Statfs_t
		if err := syscall.Statfs(mount, &st); err != nil || st.Type != cgroup1Magic {
			errs = append(errs, fmt.Errorf("%s is not a cgroup v1 mount", mount))
			continue
		}
		out = append(out, v1Dir{controller: c, mount: mount, dir: filepath.Join(mount, p, rigDir, name)})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("Options.V1Controllers: %w", err)
	}
	return out, nil
}

// ownV1Cgroups maps each v1 controller that has a hierarchy of its own to this process's cgroup path in it.
// Controllers sharing a hierarchy (a "cpu,cpuacct" mount) are left out: host-init mounts each controller alone.
func ownV1Cgroups() (map[string]string, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	own := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controller-list:path; the cgroup2 line has an empty list, named hierarchies "name=..."
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 || parts[1] == "" || strings.Contains(parts[1], ",") {
			continue
		}
		own[parts[1]] = parts[2]
	}
	return own, sc.Err()
}

// prepareV1 creates the host's v1 dirs. cpuset needs more than a mkdir: a new cpuset has no cpus and no mems and
// refuses tasks, so each level from kubeslot-rig down gets its parent's (when still empty), and clone_children=1,
// so that the cpusets the host's systemd, nspawn or runc create below inherit them (the flag is inherited too).
func prepareV1(dirs []v1Dir) error {
	for _, d := range dirs {
		if err := mkdirAllRetry(d.dir); err != nil {
			return fmt.Errorf("cgroup dir: %w", err)
		}
		if d.controller != "cpuset" {
			continue
		}
		top := filepath.Dir(d.dir) // .../kubeslot-rig
		for _, level := range []string{top, d.dir} {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				cur, err := os.ReadFile(filepath.Join(level, f))
				if err != nil {
					return fmt.Errorf("cpuset: %w", err)
				}
				if strings.TrimSpace(string(cur)) != "" {
					continue
				}
				parent, err := os.ReadFile(filepath.Join(filepath.Dir(level), f))
				if err != nil {
					return fmt.Errorf("cpuset: %w", err)
				}
				if err := os.WriteFile(filepath.Join(level, f), parent, 0o644); err != nil {
					return fmt.Errorf("cpuset: copy %s down to %s: %w", f, level, err)
				}
			}
			if err := os.WriteFile(filepath.Join(level, "cgroup.clone_children"), []byte("1"), 0o644); err != nil {
				return fmt.Errorf("cpuset: %w", err)
			}
		}
	}
	return nil
}

// strayV1Dirs are dirs of a host of this name in the machine's v1 hierarchies other than the ones this process
// would use: a crashed run in another cgroup (the CI supervisor gives each command its own memory cgroup) leaves its
// host's dirs there, below a cgroup that then cannot be removed either. Depth is bounded: a few levels of the
// machine's own cgroups above kubeslot-rig.
func strayV1Dirs(name string, mine []v1Dir) []string {
	var out []string
	for _, c := range v1Controllers {
		mount := filepath.Join("/sys/fs/cgroup", c)
		for depth := range 4 {
			pattern := filepath.Join(append(append([]string{mount}, slices.Repeat([]string{"*"}, depth)...), rigDir, name)...)
			matches, _ := filepath.Glob(pattern)
			for _, m := range matches {
				if !slices.ContainsFunc(mine, func(d v1Dir) bool { return d.dir == m }) {
					out = append(out, m)
				}
			}
		}
	}
	return out
}
