package bootstrap

// TestCachePruneOnRig: on a bootstrapped host, a repave whose kubelet download is killed (-9)
// mid-transfer leaves the download's temporary file in the artifact cache; the repave resumed by the path unit
// removes it at its start, under the installation lock, before it resumes, downloads again and commits. After the repave the cache
// holds only what the applied slot uses: leftovers of an earlier release planted beside the bootstrap's entries (a
// file, a flattened image with its sidecar, a clean tree, a tree's staging directory) are gone.

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/integration/mirror"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/requests"
)

func TestCachePruneOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	r := rig.NewRepaveRig(t, ctx, "cpr", false)
	_, applied := r.Active()
	run := func(args ...string) string {
		t.Helper()
		out, err := r.H.Run(ctx, args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	// cache lists the cache's entries as "dir/name", dot entries included.
	cache := func() []string {
		t.Helper()
		out := run("sh", "-c", "cd /opt/kubeslot/cache && for d in sha256 oci trees; do [ -d $d ] && ls -A $d | sed \"s|^|$d/|\"; done; true")
		return strings.Fields(out)
	}
	t.Logf("cache after the bootstrap: %v", cache())

	// An earlier release's leftovers.
	old := strings.Repeat("e", 64)
	run("sh", "-c", "cd /opt/kubeslot/cache && mkdir -p oci trees/"+old+"/rootfs/bin trees/."+old+".partial/rootfs && "+
		"echo old > sha256/"+old+" && echo old > oci/"+old+"-linux-amd64.tar && echo "+old+" > oci/"+old+"-linux-amd64.tar.sha256 && "+
		"echo x > trees/"+old+"/rootfs/bin/sh && echo '{}' > trees/"+old+"/complete.json")

	// The repave must download the kubelet again, slowly, so the kill lands mid-transfer.
	kubelet := r.Sums["kubelet"]
	run("rm", "/opt/kubeslot/cache/sha256/"+kubelet)
	r.Srv.SetFault("kubelet", mirror.Slow)
	desired := applied.Config
	desired.Kubernetes.Labels["kubeslot.dev/cache"] = "pruned"
	req := &requests.Request{Kind: requests.Repave, ID: requests.NewID(requests.Repave, 2, ""), MachineGeneration: 2,
		Reason: "rig: killed download", Desired: desired}
	r.Drop(ctx, req)
	tmp := ""
	rig.Eventually(t, 3*time.Minute, "the kubelet download under way (a temporary file growing in the cache)", func() (bool, string) {
		out, _ := r.H.Run(ctx, "sh", "-c", "find /opt/kubeslot/cache/sha256 -maxdepth 1 -name '."+kubelet+".tmp-*' -size +256k")
		tmp = strings.TrimSpace(string(out))
		return tmp != "", strings.Join(cache(), " ")
	})
	run("systemctl", "stop", "kubeslot-repave.path")
	run("systemctl", "kill", "-s", "KILL", "kubeslot-repave@next.service")
	rig.Eventually(t, time.Minute, "the killed repaver's unit inactive", func() (bool, string) {
		out, _ := r.H.Run(ctx, "systemctl", "is-active", "kubeslot-repave@next.service")
		st := strings.TrimSpace(string(out))
		return st != "active" && st != "activating" && st != "deactivating", st
	})
	if out, err := r.H.Run(ctx, "test", "-e", tmp); err != nil {
		t.Fatalf("the killed download's temporary file %s is not there: %v %s", tmp, err, out)
	}
	t.Logf("left by the killed download: %s", run("ls", "-l", tmp))

	// The path unit resumes the repave (it watches the state file); its start removes the temporary file.
	r.Srv.SetFault("kubelet", mirror.None)
	run("systemctl", "start", "kubeslot-repave.path")
	s := r.WaitStatus(ctx, req.ID, 6*time.Minute)
	r.LogStatus("repave after a killed download", s)
	if s.Phase != requests.Succeeded || s.ActiveSlot != "b" {
		t.Fatalf("repave status %+v", s)
	}
	// Removed at the start of the resumed run, before it resumed anything (not only by a prune after a commit).
	j, _ := r.H.Journal(ctx, "kubeslot-repave@next.service")
	removed := strings.Index(j, strings.TrimPrefix(tmp, "/opt/kubeslot/cache/sha256/"))
	resumed := strings.Index(j, "resuming an interrupted repave")
	if removed < 0 || resumed < 0 || removed > resumed {
		t.Errorf("the resumed repaver did not remove %s at its start (journal offsets: removed %d, resumed %d):\n%s",
			tmp, removed, resumed, rig.TailLines(j, 40))
	}

	// Only what the applied slot uses stays.
	slot, applied := r.Active()
	var want []string
	for _, d := range applied.Config.Digests() {
		if d != "" && !slices.Contains(want, "sha256/"+d) {
			want = append(want, "sha256/"+d)
		}
	}
	want = append(want, "trees/"+applied.Config.RootFS.SHA256)
	slices.Sort(want)
	got := cache()
	slices.Sort(got)
	t.Logf("cache after the repave onto slot %s: %v", slot, got)
	if !slices.Equal(got, want) {
		t.Errorf("cache after the repave:\n got %v\nwant %v (what applied/%s.json uses)", got, want, slot)
	}
}
