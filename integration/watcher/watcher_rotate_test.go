package watcher

// The watcher across a rotation of the node's client certificate, on the rig: the identity is laid down as the
// bootstrap leaves it (no kubeconfig file: the applied configuration's server and CA, and the kubelet's current
// client pair in <base>/identity), starts with a certificate that expires soon, and is rotated the way the kubelet's
// certificate store rotates it. The identity is held in memory (rest.Config CertData), so client-go never re-reads
// it: only the watcher's own rebuild on an identity-directory event carries the new certificate.

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/integration/machineapi"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/units"
)

// oldCertLife is how long the first certificate is valid after it is issued: enough for the watcher to start and
// sync on a loaded machine, short enough to wait out.
const oldCertLife = 90 * time.Second

func TestWatcherCertRotationOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	r := newWatcherRig(t, ctx, "wrot")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("watcher journal:\n%s", r.journal())
		}
	})
	subject := v1alpha1.NodeUserPrefix + r.node

	// The identity as the bootstrap leaves it: the rig's kubeconfig file would take precedence, so it goes, and the
	// applied configuration names the rig's apiserver and CA.
	idDir := mustOK(r.root.Path(hostroot.IdentityDir))
	if err := os.Remove(filepath.Join(idDir, "kubeconfig")); err != nil {
		t.Fatal(err)
	}
	r.applied.Cluster.Server = r.cp.URL()
	r.applied.Cluster.CAFile, r.applied.Cluster.CAPEM = "", string(r.cp.CAPEM())
	if err := state.NewStore(r.root).SaveApplied(&state.Applied{Slot: "a", Mode: "nspawn", Fingerprint: r.applied.Fingerprint(),
		AgentVersion: "devel", AppliedAt: time.Now().UTC(), Config: r.applied}); err != nil {
		t.Fatal(err)
	}
	r.record.Fingerprint = r.applied.Fingerprint()
	r.complete()

	oldCert, oldKey, err := r.cp.ClientCertUntil(subject, time.Now().Add(oldCertLife), "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	oldNotAfter := certNotAfter(t, oldCert)
	oldFile := kubeletStoreClientPair(t, idDir, oldCert, oldKey, time.Now())

	getMachine := func() *v1alpha1.Machine {
		m, err := r.admin.GetMachine(ctx, r.node)
		if err != nil {
			return nil
		}
		return m
	}
	t0 := time.Now()
	if res := r.start(units.Watcher); res != "done" {
		t.Fatalf("start job: %s", res)
	}
	rig.Eventually(t, 60*time.Second, "Machine registered and reported Ready", func() (bool, string) {
		m := getMachine()
		if m == nil {
			return false, "no Machine"
		}
		return m.Status.Phase == v1alpha1.MachineReady && m.Status.Applied != nil &&
			string(m.Status.Applied.Fingerprint) == r.applied.Fingerprint(), fmt.Sprintf("%+v", m.Status)
	})
	rig.Timing(t, "watcher start on the kubelet's identity -> Machine Ready", time.Since(t0))
	if j := r.journal(); strings.Contains(j, "node identity changed") {
		t.Errorf("identity change reported before any rotation:\n%s", rig.TailLines(j, 30))
	}
	if left := time.Until(oldNotAfter); left < 15*time.Second {
		t.Fatalf("the first certificate expires in %v, before it could be rotated in time: the start took %v (raise oldCertLife)",
			left.Round(time.Second), time.Since(t0).Round(time.Second))
	}
	pid, restarts := r.svc("MainPID").(uint32), r.svc("NRestarts").(uint32)
	synced := strings.Count(r.journal(), "watches synced")

	// Rotate to a long-lived certificate, as the kubelet does well before expiry.
	newCert, newKey, err := r.cp.NodeClientCert(r.node)
	if err != nil {
		t.Fatal(err)
	}
	tRot := time.Now()
	// The kubelet names pairs by the second: a pair stored in the same second would overwrite the first one.
	newFile := kubeletStoreClientPair(t, idDir, newCert, newKey, time.Now().Add(time.Second))
	t.Logf("rotated %s -> %s, %v before the first certificate expires", oldFile, newFile, time.Until(oldNotAfter).Round(time.Second))
	// The rotation is carried by a new loop (the journal says so, and its watches sync again), not by a restart.
	resynced := false
	for time.Since(tRot) < 30*time.Second {
		j := r.journal()
		if strings.Contains(j, "node identity changed; reconnecting") && strings.Count(j, "watches synced") > synced {
			resynced = true
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !resynced {
		// Not fatal: what follows shows whether the new certificate is in use regardless.
		t.Errorf("within 30 s of the rotation the journal shows no reconnect with the watches synced again (%d synced lines before):\n%s",
			synced, rig.TailLines(r.journal(), 30))
	} else {
		rig.Timing(t, "rotation -> watches synced on the new identity", time.Since(tRot))
	}

	// Once the first certificate has expired, the apiserver refuses it: a control that the wait below is real.
	wait := time.Until(oldNotAfter) + 2*time.Second
	t.Logf("waiting %v for the first certificate to expire (notAfter %s)", wait.Round(time.Second), oldNotAfter.Format(time.RFC3339))
	select {
	case <-time.After(wait):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if err := getAs(ctx, t, r, oldCert, oldKey); !apierrors.IsUnauthorized(err) {
		t.Fatalf("the expired certificate: get Machine: %v, want 401 Unauthorized", err)
	}
	if err := getAs(ctx, t, r, newCert, newKey); err != nil {
		t.Fatalf("the rotated certificate: get Machine: %v", err)
	}

	// A spec change is dispatched, and the Machine's status written, by the watcher as the rotated identity.
	gen := r.updateSpec(t, func(m *v1alpha1.Machine) {
		m.Spec.UpdatePolicy = v1alpha1.UpdateImmediate
		m.Spec.Node.KubernetesVersion = "1.99.1"
	})
	want := requests.NewID(requests.Repave, gen, "")
	rig.Eventually(t, 30*time.Second, "repave request "+want, func() (bool, string) {
		id := r.pendingID(requests.Repave)
		return id == want, id
	})
	rig.Eventually(t, 30*time.Second, fmt.Sprintf("status.observedGeneration %d written after the first certificate expired", gen),
		func() (bool, string) {
			m := getMachine()
			return m != nil && m.Status.ObservedGeneration == gen, fmt.Sprintf("%+v", m.Status)
		})
	req := r.claim(requests.Repave)
	const msg = "test: failed after the certificate rotation"
	if err := r.dir.WriteStatus(&requests.Status{RequestID: req.ID, Kind: requests.Repave, MachineGeneration: gen,
		Phase: requests.Failed, Message: msg}); err != nil {
		t.Fatal(err)
	}
	os.Remove(mustOK(r.dir.ClaimedPath(requests.Repave)))
	rig.Eventually(t, 30*time.Second, "Repaved=False published on the Machine", func() (bool, string) {
		m := getMachine()
		c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.ConditionRepaved)
		return c != nil && c.Status == metav1.ConditionFalse && strings.Contains(c.Message, msg), fmt.Sprintf("%+v", c)
	})

	if got := r.svc("MainPID").(uint32); got != pid {
		t.Errorf("MainPID %d -> %d: the watcher restarted instead of rebuilding its client", pid, got)
	}
	if got := r.svc("NRestarts").(uint32); got != restarts {
		t.Errorf("NRestarts %d -> %d over the rotation", restarts, got)
	}
	// The rebuild came before the expiry: no request of the watcher was ever refused.
	j := r.journal()
	if n := strings.Count(j, "Unauthorized") + strings.Count(j, "system:anonymous"); n > 0 {
		t.Errorf("%d refused requests in the watcher's journal:\n%s", n, rig.TailLines(j, 40))
	}
	// The rotation's several file events settle into one rebuild, for the one new identity.
	if n := strings.Count(j, "node identity changed; reconnecting"); n != 1 {
		t.Errorf("%d reconnects over one rotation, want 1", n)
	}
}

// kubeletStoreClientPair stores a client pair in the identity directory (local path) the way the kubelet's
// certificate store does (client-go util/certificate, fileStore.Update): certificate and key in one new file
// kubelet-client-<timestamp>.pem, then a symlink kubelet-client-updated.pem to it, by its path inside the node
// where the directory is bound, renamed over kubelet-client-current.pem. It returns the new file's name.
func kubeletStoreClientPair(t *testing.T, dir string, certPEM, keyPEM []byte, at time.Time) string {
	t.Helper()
	name := "kubelet-client-" + at.Format("2006-01-02-15-04-05") + ".pem"
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Write(append(append([]byte(nil), certPEM...), keyPEM...))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	updated := filepath.Join(dir, "kubelet-client-updated.pem")
	if err := os.Symlink(filepath.Join(nodeconfig.CertDir, name), updated); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(updated, filepath.Join(dir, "kubelet-client-current.pem")); err != nil {
		t.Fatal(err)
	}
	return name
}

func certNotAfter(t *testing.T, certPEM []byte) time.Time {
	t.Helper()
	block, _ := pem.Decode(certPEM)
	if block == nil {
		t.Fatal("no PEM block in the issued certificate")
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c.NotAfter
}

// getAs reads the rig's Machine with a client certificate, a fresh connection each time.
func getAs(ctx context.Context, t *testing.T, r *watcherRig, certPEM, keyPEM []byte) error {
	t.Helper()
	c, err := machineapi.New(r.cp.CertConfig(certPEM, keyPEM))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.GetMachine(ctx, r.node)
	return err
}
