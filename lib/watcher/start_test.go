package watcher

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/stagekit"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
)

// fakeOperator records EnsureHooks calls.
type fakeOperator struct {
	calls int
	err   error
}

func (o *fakeOperator) EnsureHooks(context.Context) error { o.calls++; return o.err }
func (o *fakeOperator) RestartNode(context.Context, string) (time.Time, error) {
	return time.Time{}, errors.New("the watcher must not restart the node")
}
func (o *fakeOperator) Repave(context.Context, string, string) error {
	return errors.New("the watcher must not repave")
}

// completeHost lays down a complete installation with slot a active and a
// node identity kubeconfig for node1.
func completeHost(t *testing.T) (*hostroot.Root, Command) {
	t.Helper()
	root := testkit.Root(t)
	cfg := testhost.Example(t)
	cfg.Machine.Name = "node1"
	testhost.Installed(t, root, cfg)
	kc := mustPath(t, root, hostroot.IdentityDir, "kubeconfig")
	if err := os.MkdirAll(filepath.Dir(kc), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kc, nodeKubeconfig(t, "node1"), 0o600); err != nil {
		t.Fatal(err)
	}
	return root, Command{Host: stagekit.Host{Getenv: os.Getenv, Log: slog.New(slog.DiscardHandler)}, root: root, drv: &stagekit.Driver{Root: root}, LockWait: 2 * time.Second}
}

func mustPath(t *testing.T, root *hostroot.Root, elem ...string) string {
	t.Helper()
	p, err := root.Path(elem...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// nodeKubeconfig is a kubeconfig with a self-signed client certificate for
// system:node:<node>; nothing connects with it.
func nodeKubeconfig(t *testing.T, node string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "system:node:" + node},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	b64 := func(typ string, b []byte) string {
		return base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}))
	}
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
users:
- name: u
  user: {client-certificate-data: %s, client-key-data: %s}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`, b64("CERTIFICATE", der), b64("EC PRIVATE KEY", kder))
}

func withOperator(t *testing.T, op *fakeOperator, buildErr error) *int {
	t.Helper()
	built := 0
	prev := newOperator
	newOperator = func(_ context.Context, _ *hostroot.Root, _ string, rec *ownership.Record, a *state.Applied, _ isolation.Settings, _ *slog.Logger) (isolation.Operator, func(), error) {
		built++
		if rec == nil || a.Slot != "a" {
			t.Errorf("operator built with record %v and slot %q; want the record and the active slot a", rec, a.Slot)
		}
		if buildErr != nil {
			return nil, nil, buildErr
		}
		return op, func() {}, nil
	}
	t.Cleanup(func() { newOperator = prev })
	return &built
}

func TestStartEnsuresHooks(t *testing.T) {
	_, w := completeHost(t)
	op := &fakeOperator{}
	withOperator(t, op, nil)
	var logs bytes.Buffer
	w.Log = slog.New(slog.NewTextHandler(&logs, nil))
	st, err := w.start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if op.calls != 1 || st.hooksErr != nil || st.nodeName != "node1" {
		t.Errorf("EnsureHooks called %d times, hooksErr %v, node %q; want once, nil, node1", op.calls, st.hooksErr, st.nodeName)
	}
	if !strings.Contains(logs.String(), "lifecycle hooks of the active slot ensured") {
		t.Errorf("no line saying the hooks were ensured:\n%s", logs.String())
	}
}

func TestStartHooksFailureIsNotFatal(t *testing.T) {
	for _, c := range []struct {
		name     string
		op       *fakeOperator
		buildErr error
		want     string
	}{
		{"EnsureHooks fails", &fakeOperator{err: errors.New("reload: connection refused")}, nil, "connection refused"},
		{"no operator for the mode", &fakeOperator{}, errors.New("isolation mode \"vm\": unknown"), "unknown"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, w := completeHost(t)
			withOperator(t, c.op, c.buildErr)
			var logs bytes.Buffer
			w.Log = slog.New(slog.NewTextHandler(&logs, nil))
			st, err := w.start(context.Background())
			if err != nil {
				t.Fatalf("start failed on a hooks failure: %v", err)
			}
			if st.hooksErr == nil || !strings.Contains(st.hooksErr.Error(), c.want) || !strings.Contains(st.hooksErr.Error(), "slot a") {
				t.Errorf("hooksErr %v: want it to name slot a and say %q", st.hooksErr, c.want)
			}
			if !strings.Contains(logs.String(), "level=WARN") || strings.Contains(logs.String(), "level=ERROR") {
				t.Errorf("want a warning and no error line:\n%s", logs.String())
			}
		})
	}
}

func TestStartNoHooksWithoutTrustedSlot(t *testing.T) {
	root, w := completeHost(t)
	p := mustPath(t, root, hostroot.AppliedDir, "a.json")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, append(b, ' '), 0o600); err != nil {
		t.Fatal(err)
	}
	op := &fakeOperator{}
	built := withOperator(t, op, nil)
	if _, err := w.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if *built != 0 || op.calls != 0 {
		t.Errorf("operator built %d times, EnsureHooks called %d times from a corrupt applied configuration", *built, op.calls)
	}
}

func TestStartBadSettingsIsUsageError(t *testing.T) {
	_, w := completeHost(t)
	withOperator(t, &fakeOperator{}, nil)
	t.Setenv("KUBESLOT_NODE_KUBELET_PORT", "many")
	_, err := w.start(context.Background())
	if exitcode.Of(err) != exitcode.Usage || !strings.Contains(fmt.Sprint(err), "many") {
		t.Errorf("err %v (exit %d): want a usage error naming the value", err, exitcode.Of(err))
	}
}

// A host being reset (a boot in the middle of an AgentReset) starts its
// watcher, which publishes the reset's result, and leaves the node alone.
func TestStartOnAHostBeingReset(t *testing.T) {
	root, w := completeHost(t)
	rec, err := ownership.Load(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.SetCheckpoint(ownership.CheckpointResetting); err != nil {
		t.Fatal(err)
	}
	if err := ownership.Save(root, rec); err != nil {
		t.Fatal(err)
	}
	op := &fakeOperator{}
	built := withOperator(t, op, nil)
	st, err := w.start(context.Background())
	if err != nil {
		t.Fatalf("start on a host being reset: %v", err)
	}
	if st.nodeName != "node1" || *built != 0 || op.calls != 0 {
		t.Errorf("node %q, operator built %d times, hooks ensured %d times; want node1 and the node left alone", st.nodeName, *built, op.calls)
	}
}

// TestStoppedWhileWaitingForTheLock: a watcher stopped (SIGTERM) while it
// waits for the lock exits 69, not 1: a failure would start the recovery
// unit (OnFailure=) and roll an upgrade back (found on the rig: the
// upgrader restarts the watcher while it holds the lock).
func TestStoppedWhileWaitingForTheLock(t *testing.T) {
	root, c := completeHost(t)
	l, err := ownership.Acquire(context.Background(), root, ownership.Holder{Stage: "kubeslot-test"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond) // the SIGTERM
	defer cancel()
	c.LockWait = time.Second
	_, err = c.start(ctx)
	if exitcode.Of(err) != exitcode.Deferred || !strings.Contains(fmt.Sprint(err), "stopped while waiting") {
		t.Errorf("stopped while waiting: %v (exit %d), want %d", err, exitcode.Of(err), exitcode.Deferred)
	}
}
