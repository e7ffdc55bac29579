package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/cli/clitest"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
	"github.com/kubeslot/kubeslot/lib/verify/verifytest"
)

func TestCommonFlags(t *testing.T) { clitest.CommonFlags(t, name, run) }

func TestConfigExampleChecks(t *testing.T) {
	code, example, _ := clitest.Call(run, "", "config", "example")
	if code != exitcode.OK || !strings.Contains(example, "[machine]") {
		t.Fatalf("config example: exit %d, output %q", code, example)
	}
	f := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(f, []byte(example), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs := clitest.Call(run, "", "config", "check", f)
	if code != exitcode.OK || !strings.Contains(out, "ok") || !strings.Contains(out, "fingerprint") {
		t.Fatalf("check example: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	// the same through standard input
	if code, out, _ := clitest.Call(run, example, "config", "check", "-"); code != exitcode.OK || !strings.Contains(out, "ok") {
		t.Fatalf("check -: exit %d, %q", code, out)
	}
}

// config check warns about a kubelet from a remote mirror that nobody
// pinned; the configuration is still valid, and a pin quiets it.
func TestConfigCheckWarnsUnpinnedKubelet(t *testing.T) {
	doc := string(config.Example())
	i, j := strings.Index(doc, "\n[artifacts.kubelet]\n"), strings.Index(doc, "\n[artifacts.containerd]\n")
	doc = doc[:i] + "\n[kubernetes.release]\nmirror = \"https://dl.k8s.io/release\"\n\n" + doc[j:]
	code, out, errs := clitest.Call(run, doc, "config", "check", "-")
	if code != exitcode.OK || !strings.Contains(out, "ok") || !strings.Contains(errs, "warning:") || !strings.Contains(errs, "kubelet_sha256") {
		t.Fatalf("unpinned: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	doc += "\n[kubernetes.release.kubelet_sha256]\n\"1.37.2\" = \"" + strings.Repeat("ab", 32) + "\"\n"
	if code, _, errs := clitest.Call(run, doc, "config", "check", "-"); code != exitcode.OK || errs != "" {
		t.Errorf("pinned: exit %d, stderr %q", code, errs)
	}
}

func TestConfigCheckBrokenFile(t *testing.T) {
	f := filepath.Join(t.TempDir(), "broken.toml")
	broken := strings.Replace(string(config.Example()), `name = "worker-1"`, "name = \"worker-1\"\nflavour = \"x\"", 1)
	broken = strings.Replace(broken, `version = "1.37.2"`, `version = "latest"`, 1)
	if err := os.WriteFile(f, []byte(broken), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs := clitest.Call(run, "", "config", "check", f)
	if code != exitcode.Failure {
		t.Fatalf("exit %d, want %d; stdout %q", code, exitcode.Failure, out)
	}
	for _, want := range []string{f + ":", "machine.flavour", "kubernetes.version", `"latest"`} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr does not contain %q:\n%s", want, errs)
		}
	}
	if strings.Contains(errs, "0123456789abcdef") {
		t.Errorf("stderr leaks the bootstrap token:\n%s", errs)
	}
}

func TestStatusEmptyRoot(t *testing.T) {
	prefix := t.TempDir()
	code, out, errs := clitest.Call(run, "", "--root-prefix", prefix, "status")
	if code != exitcode.OK || !strings.Contains(out, "No kubeslot installation") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
	code, out, _ = clitest.Call(run, "", "--root-prefix", prefix, "status", "-o", "json")
	var st status
	if err := json.Unmarshal([]byte(out), &st); err != nil || code != exitcode.OK || st.Installed {
		t.Fatalf("json: exit %d, %v, %q", code, err, out)
	}
}

// installed lays down what a completed bootstrap leaves (record, applied
// configuration for slot a, the active pointer) and a pending request.
func installed(t *testing.T) (prefix string, root *hostroot.Root) {
	t.Helper()
	root = testkit.Root(t)
	testhost.Installed(t, root, testhost.Example(t))
	req, _ := root.Path(hostroot.RequestsDir, "repave.json")
	if err := os.WriteFile(req, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	return root.Prefix(), root
}

func TestStatusInstalled(t *testing.T) {
	prefix, _ := installed(t)
	code, out, errs := clitest.Call(run, "", "--root-prefix", prefix, "status")
	if code != exitcode.OK {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	for _, want := range []string{"worker-1", "complete", "Active slot:", "a (nspawn mode", "repave.json"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = clitest.Call(run, "", "--root-prefix", prefix, "status", "-o", "json")
	var st status
	if err := json.Unmarshal([]byte(out), &st); err != nil || code != exitcode.OK {
		t.Fatalf("json: exit %d, %v", code, err)
	}
	if !st.Installed || st.ActiveSlot != "a" || st.Ownership.Checkpoint != "complete" || len(st.Requests) != 1 {
		t.Errorf("json status: %+v", st)
	}
	if strings.Contains(out, "0123456789abcdef") {
		t.Errorf("status leaks the bootstrap token:\n%s", out)
	}
}

func TestStatusDamagedApplied(t *testing.T) {
	prefix, root := installed(t)
	p, _ := root.Path(hostroot.AppliedDir, "a.json")
	if err := os.Truncate(p, 10); err != nil {
		t.Fatal(err)
	}
	code, out, _ := clitest.Call(run, "", "--root-prefix", prefix, "status")
	if code != exitcode.Failure {
		t.Fatalf("exit %d, want %d", code, exitcode.Failure)
	}
	if !strings.Contains(out, "PROBLEM: "+p) || !strings.Contains(out, "checksum mismatch") {
		t.Errorf("status does not report the damaged file:\n%s", out)
	}
	if !strings.Contains(out, "worker-1") {
		t.Errorf("status should still show the ownership record:\n%s", out)
	}
}

// An empty root prefix or host root is refused, never taken for "/".
func TestEmptyRootRefused(t *testing.T) { clitest.EmptyRoot(t, name, run, "status") }

// status lists claimed requests (with their IDs) and request files moved
// aside as unusable.
func TestStatusClaimedAndRejected(t *testing.T) {
	prefix, root := installed(t)
	stateDir, _ := root.Path(hostroot.StateDir)
	for name, body := range map[string]string{
		"claimed-restart.json":                 `{"kind":"restart","id":"restart-7-op-a","operation":"op-a"}`,
		"claimed-upgrade.json":                 `not json`,
		"rejected-repave-request-1234567.json": `{"kind":"restart"}`,
	} {
		if err := os.WriteFile(filepath.Join(stateDir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errs := clitest.Call(run, "", "--root-prefix", prefix, "status")
	for _, want := range []string{"Claimed requests:", "claimed-restart.json (restart-7-op-a)", "claimed-upgrade.json (unusable",
		"Refused requests:", "rejected-repave-request-1234567.json"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q (exit %d, stderr %q):\n%s", want, code, errs, out)
		}
	}
	_, out, _ = clitest.Call(run, "", "--root-prefix", prefix, "status", "-o", "json")
	var st status
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st.Claimed) != 2 || len(st.Rejected) != 1 {
		t.Errorf("json status: %v %+v", err, st)
	}
}

// config check warns about a configuration with a join token that others can
// read; it still says the configuration is valid.
func TestConfigCheckWarnsReadableSecret(t *testing.T) {
	f := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(f, config.Example(), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(f, 0o644)
	code, out, errs := clitest.Call(run, "", "config", "check", f)
	if code != exitcode.OK || !strings.Contains(out, ": ok") || !strings.Contains(errs, "readable by others") || !strings.Contains(errs, "chmod 600") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
	os.Chmod(f, 0o600)
	if _, _, errs := clitest.Call(run, "", "config", "check", f); errs != "" {
		t.Errorf("0600: stderr %q", errs)
	}
}

// status says what is wrong instead of looking healthy:
// a layout version from a later release, an active pointer naming no valid
// slot (the file named), terminal escapes in record fields, a damaged
// ownership record.
func TestStatusHostileState(t *testing.T) {
	t.Run("future layout version", func(t *testing.T) {
		prefix, root := installed(t)
		p, _ := root.File(hostroot.LayoutFile)
		os.WriteFile(p, []byte("7\n"), 0o644)
		code, out, _ := clitest.Call(run, "", "--root-prefix", prefix, "status")
		if code != exitcode.Failure || !strings.Contains(out, "PROBLEM") || !strings.Contains(out, "layout version 7") {
			t.Errorf("exit %d:\n%s", code, out)
		}
	})
	t.Run("bad active names the file", func(t *testing.T) {
		prefix, root := installed(t)
		p, _ := root.File(hostroot.AppliedDir, "active")
		if err := state.WriteChecksummed(p, []byte("../x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		code, out, _ := clitest.Call(run, "", "--root-prefix", prefix, "status")
		if code != exitcode.Failure || !strings.Contains(out, "PROBLEM: "+p) {
			t.Errorf("exit %d, want a problem naming %s:\n%s", code, p, out)
		}
	})
	t.Run("terminal escapes", func(t *testing.T) {
		prefix, root := installed(t)
		rec, _ := ownership.Load(root)
		rec.AgentVersion = "v1\x1b[2J\x1b]0;pwned\x07"
		if err := ownership.Save(root, rec); err != nil {
			t.Fatal(err)
		}
		_, out, _ := clitest.Call(run, "", "--root-prefix", prefix, "status")
		if strings.ContainsAny(out, "\x1b\x07") || !strings.Contains(out, `v1\x1b[2J`) {
			t.Errorf("escapes printed raw or dropped silently: %q", out)
		}
	})
	t.Run("damaged ownership record", func(t *testing.T) {
		prefix, root := installed(t)
		p, _ := root.File(hostroot.OwnershipFile)
		os.WriteFile(p, []byte(`{"schemaVersion": 1, "installID": 7`), 0o600)
		code, out, _ := clitest.Call(run, "", "--root-prefix", prefix, "status")
		if code != exitcode.Failure || strings.Contains(out, "Ownership:  none") || !strings.Contains(out, "damaged") || !strings.Contains(out, "kubeslot-resetter --force") {
			t.Errorf("exit %d:\n%s", code, out)
		}
	})
}

// A pending request no worker can use is marked so, like a claimed one: the
// worker moves it aside rather than running it.
func TestStatusUnusablePending(t *testing.T) {
	prefix, root := installed(t)
	dir, _ := root.Path(hostroot.RequestsDir)
	os.MkdirAll(dir, 0o700)
	for name, body := range map[string]string{
		"restart.json": `{"kind":"restart","id":"restart-7-op-a","operation":"op-a"}`,
		"repave.json":  `{"kind":"restart","id":"restart-8-op-b"}`,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	_, out, _ := clitest.Call(run, "", "--root-prefix", prefix, "status")
	if !strings.Contains(out, "repave.json (unusable:") || !strings.Contains(out, "holds a restart request") || strings.Contains(out, "restart.json (unusable") {
		t.Errorf("pending requests not marked by usability:\n%s", out)
	}
}

// Status says how each slot's rootfs is made, from the slot's own record:
// a layered slot, a copied one with the reason no fast path was taken, none.
func TestStatusSlotMechanism(t *testing.T) {
	prefix, root := installed(t)
	put := func(hostPath, data string) {
		t.Helper()
		local := filepath.Join(root.Prefix(), hostPath)
		if err := os.MkdirAll(filepath.Dir(local), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(local, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	put("/var/lib/machines/.a.layers/layers.json", `{"stamp": {"rootfs": "r", "kubelet": "k", "rootfs_mechanism": "overlay"}, "artifacts": "x", "builtAt": "2030-01-01T00:00:00Z"}`)
	code, out, errs := clitest.Call(run, "", "--root-prefix", prefix, "status")
	if code != exitcode.OK || !regexp.MustCompile(`Slot a rootfs: +overlay\n`).MatchString(out) || !regexp.MustCompile(`Slot b rootfs: +none\n`).MatchString(out) {
		t.Errorf("exit %d, stderr %q, status:\n%s", code, errs, out)
	}
	put("/var/lib/machines/b/etc/kubeslot/provisioned.json", `{"rootfs": "r", "kubelet": "k", "rootfs_mechanism": "copy", "no_fast_path": "trial overlay mount failed: upper on nfs"}`)
	code, out, _ = clitest.Call(run, "", "--root-prefix", prefix, "status", "-o", "json")
	var st status
	if err := json.Unmarshal([]byte(out), &st); err != nil || code != exitcode.OK {
		t.Fatalf("json: exit %d, %v", code, err)
	}
	want := []slotView{{Slot: "a", Rootfs: "overlay"}, {Slot: "b", Rootfs: "copy", NoFastPath: "trial overlay mount failed: upper on nfs"}}
	if !slices.Equal(st.Slots, want) {
		t.Errorf("slots %+v, want %+v", st.Slots, want)
	}
}

// config check warns about a join token on a host whose node identity
// exists (a standing credential the node does not need), and about a
// configuration without one on a host without an identity (it cannot
// join); otherwise it advises a short-lived token.
func TestConfigCheckJoinToken(t *testing.T) {
	prefix := t.TempDir()
	root, err := hostroot.New(prefix, "")
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(f, config.Example(), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs := clitest.Call(run, "", "--root-prefix", prefix, "config", "check", f)
	if code != exitcode.OK || errs != "" || !strings.Contains(out, "short-lived") {
		t.Errorf("no identity: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if err := os.MkdirAll(filepath.Join(prefix, "opt/kubeslot/identity"), 0o700); err != nil {
		t.Fatal(err)
	}
	verifytest.Identity(t, root, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	code, _, errs = clitest.Call(run, "", "--root-prefix", prefix, "config", "check", f)
	if code != exitcode.OK || !strings.Contains(errs, "warning: cluster.bootstrap_token") || !strings.Contains(errs, "long-lived") {
		t.Errorf("identity and token: exit %d, stderr %q", code, errs)
	}
	scrubbed, _, err := config.RemoveJoinToken(config.Example(), "removed")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f, scrubbed, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := clitest.Call(run, "", "--root-prefix", prefix, "config", "check", f); code != exitcode.OK || errs != "" {
		t.Errorf("identity, no token: exit %d, stderr %q", code, errs)
	}
	if err := os.RemoveAll(filepath.Join(prefix, "opt/kubeslot/identity")); err != nil {
		t.Fatal(err)
	}
	code, _, errs = clitest.Call(run, "", "--root-prefix", prefix, "config", "check", f)
	if code != exitcode.OK || !strings.Contains(errs, "cannot join") {
		t.Errorf("no identity, no token: exit %d, stderr %q", code, errs)
	}
}

// kubeslot version says the stamped version, the platform and Go's.
func TestVersion(t *testing.T) {
	code, out, _ := clitest.Call(run, "", "version")
	if code != exitcode.OK || !strings.HasPrefix(out, "kubeslot devel linux/") || !strings.Contains(out, " go1.") {
		t.Errorf("version: exit %d, %q", code, out)
	}
}
