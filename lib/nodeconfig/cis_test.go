package nodeconfig

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/kubeslot/kubeslot/lib/testkit"
)

// cisSection is README's table of the production kubelet profile against the
// CIS Kubernetes Benchmark's worker node section.
const cisSection = "### Kubelet profile and the CIS benchmark (worker node)"

// cisRow is one row of that table: the status it claims and the value, each
// asserted on the production profile by TestCISProfile.
type cisRow struct {
	status string // how the row's status cell starts: "pass", "n/a" or "deviation"
	// key is a kubelet configuration key (dotted), want its value; the
	// claim is "key: value". want nil: the key is not set.
	key  string
	want any
	// paths are node files, claimed to have mode (or, owner set, to be
	// root's).
	paths []string
	mode  fs.FileMode
	owner bool
	// claim replaces the derived claim (flags, rows not applicable).
	claim string
	// flag is a kubelet unit argument the row claims is there.
	flag string
}

var kubeletUnitFiles = []string{KubeletUnitPath, NodeIPDropIn}

// cisRows are README's rows, by item number (benchmark v1.12). Two have no
// current number: protectKernelDefaults (an item of earlier editions) and
// the API's listen address.
var cisRows = map[string]cisRow{
	"4.1.1":              {status: "pass", paths: kubeletUnitFiles, mode: 0o600},
	"4.1.2":              {status: "pass", paths: kubeletUnitFiles, owner: true},
	"4.1.3":              {status: "n/a", claim: "no kube-proxy on the node"},
	"4.1.4":              {status: "n/a", claim: "no kube-proxy on the node"},
	"4.1.5":              {status: "pass", paths: []string{BootstrapKubeconfig, KubeletKubeconfig}, mode: 0o600},
	"4.1.6":              {status: "pass", paths: []string{BootstrapKubeconfig, KubeletKubeconfig}, owner: true},
	"4.1.7":              {status: "pass", paths: []string{CAFile}, mode: 0o600},
	"4.1.8":              {status: "pass", paths: []string{CAFile}, owner: true},
	"4.1.9":              {status: "pass", paths: []string{KubeletConfig}, mode: 0o600},
	"4.1.10":             {status: "pass", paths: []string{KubeletConfig}, owner: true},
	"4.2.1":              {status: "pass", key: "authentication.anonymous.enabled", want: false},
	"4.2.2":              {status: "pass", key: "authorization.mode", want: "Webhook"},
	"4.2.3":              {status: "pass", key: "authentication.x509.clientCAFile", want: CAFile},
	"4.2.4":              {status: "pass", key: "readOnlyPort", want: 0},
	"4.2.5":              {status: "pass", key: "streamingConnectionIdleTimeout", want: "4h0m0s"},
	"4.2.6":              {status: "deviation", key: "makeIPTablesUtilChains", want: false},
	"4.2.7":              {status: "deviation", flag: "--hostname-override=", claim: "--hostname-override=<node name>"},
	"4.2.8":              {status: "pass", key: "eventRecordQPS", want: 50},
	"4.2.9":              {status: "deviation", key: "serverTLSBootstrap", want: true},
	"4.2.10":             {status: "pass", key: "rotateCertificates", want: true},
	"4.2.11":             {status: "pass", key: "featureGates", want: nil, claim: "featureGates: not set (the gate is on by default)"},
	"4.2.12":             {status: "pass", key: "tlsCipherSuites", want: tlsCipherSuites},
	"4.2.13":             {status: "pass", key: "podPidsLimit", want: podPidsLimit},
	"4.2.14":             {status: "pass", key: "seccompDefault", want: true},
	"(4.2.6 up to v1.8)": {status: "deviation", key: "protectKernelDefaults", want: false},
	"(none)":             {status: "n/a", key: "address", want: "0.0.0.0"},
}

// claimOf is the value cell README shows for row, without backquotes.
func (r cisRow) claimOf() string {
	switch {
	case r.claim != "":
		return r.claim
	case r.owner:
		return "root:root"
	case r.paths != nil:
		return fmt.Sprintf("%04o", r.mode)
	}
	v := fmt.Sprint(r.want)
	if l, ok := r.want.([]string); ok {
		v = "[" + strings.Join(l, ", ") + "]"
	}
	return r.key + ": " + v
}

// TestCISProfile renders the production profile (Options' zero value) and
// asserts every row of cisRows on it, then checks that README's table has
// exactly these rows, statuses and values.
func TestCISProfile(t *testing.T) {
	files := render(t, testConfig(t, testkit.CA(t), ""), Options{})
	var kc map[string]any
	if err := yaml.Unmarshal(files[KubeletConfig].Data, &kc); err != nil {
		t.Fatalf("kubelet config is not YAML: %v", err)
	}
	// The files as WriteFiles leaves them: owned by the writer (the stages
	// run as root; nothing chowns them to another user).
	rootfs := t.TempDir()
	var list []File
	for _, f := range files {
		list = append(list, f)
	}
	// The kubelet writes its kubeconfig itself (0600, root's): stand in
	// for it so that the rows name it, and the pre-start hook the node-IP
	// drop-in (lib/isolation/nspawn, also 0600).
	list = append(list, File{KubeletKubeconfig, []byte("x"), 0o600}, File{NodeIPDropIn, []byte("x"), 0o600})
	if _, err := WriteFiles(rootfs, list); err != nil {
		t.Fatal(err)
	}
	modes := map[string]fs.FileMode{KubeletKubeconfig: 0o600, NodeIPDropIn: 0o600}
	for _, f := range files {
		modes[f.Path] = f.Mode
	}

	for item, r := range cisRows {
		switch {
		case r.flag != "":
			if !strings.Contains(string(files[KubeletUnitPath].Data), r.flag) {
				t.Errorf("%s: the kubelet unit lacks %s", item, r.flag)
			}
		case r.owner:
			for _, p := range r.paths {
				fi, err := os.Stat(filepath.Join(rootfs, p))
				if err != nil {
					t.Errorf("%s: %v", item, err)
					continue
				}
				st := fi.Sys().(*syscall.Stat_t)
				if int(st.Uid) != os.Getuid() || int(st.Gid) != os.Getgid() {
					t.Errorf("%s: %s owned by %d:%d, not the writer %d:%d", item, p, st.Uid, st.Gid, os.Getuid(), os.Getgid())
				}
			}
		case r.paths != nil:
			for _, p := range r.paths {
				m, ok := modes[p]
				if !ok || m.Perm()&^r.mode != 0 {
					t.Errorf("%s: %s mode %04o, want %04o or stricter", item, p, m.Perm(), r.mode)
				}
			}
		case r.key != "":
			got, ok := lookup(kc, r.key)
			if r.want == nil {
				if ok {
					t.Errorf("%s: %s is set: %v", item, r.key, got)
				}
				continue
			}
			if g, w := mustJSON(got), mustJSON(r.want); !ok || g != w {
				t.Errorf("%s: %s = %s, want %s", item, r.key, g, w)
			}
		}
	}

	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	rows, err := cisTable(string(readme))
	if err != nil {
		t.Fatal(err)
	}
	for item, r := range cisRows {
		got, ok := rows[item]
		switch {
		case !ok:
			t.Errorf("README's CIS table has no row %q", item)
		case got[0] != "`"+r.claimOf()+"`":
			t.Errorf("README's CIS row %s claims %s, the profile has `%s`", item, got[0], r.claimOf())
		case !strings.HasPrefix(got[1], r.status):
			t.Errorf("README's CIS row %s has status %q, want %s", item, got[1], r.status)
		}
	}
	for item := range rows {
		if _, ok := cisRows[item]; !ok {
			t.Errorf("README's CIS table has row %q, which no test checks", item)
		}
	}
}

// cisTable returns the rows of README's CIS table: item -> [value, status].
func cisTable(readme string) (map[string][2]string, error) {
	_, after, ok := strings.Cut(readme, "\n"+cisSection+"\n")
	if !ok {
		return nil, fmt.Errorf("README has no section %q", cisSection)
	}
	rows := map[string][2]string{}
	for _, l := range strings.Split(after, "\n") {
		if strings.HasPrefix(l, "#") {
			break
		}
		if !strings.HasPrefix(l, "| ") || strings.HasPrefix(l, "| item ") {
			continue
		}
		cells := strings.Split(strings.Trim(l, "| "), " | ")
		if len(cells) != 4 {
			return nil, fmt.Errorf("README's CIS table: want 4 cells (item, what, kubeslot, status): %q", l)
		}
		if _, dup := rows[cells[0]]; dup {
			return nil, fmt.Errorf("README's CIS table: row %q twice", cells[0])
		}
		rows[cells[0]] = [2]string{cells[2], cells[3]}
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("README's section %q has no table", cisSection)
	}
	return rows, nil
}

// lookup finds a dotted key in a decoded document.
func lookup(doc map[string]any, key string) (any, bool) {
	var cur any = doc
	for _, k := range strings.Split(key, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[k]; !ok {
			return nil, false
		}
	}
	return cur, true
}
