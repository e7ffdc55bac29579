package main

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

	"github.com/kubeslot/kubeslot/lib/cli/clitest"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/state"
)

// fakeOperator records EnsureHooks calls.
type fakeOperator struct {
	calls int
	err   error
}

func (o *fakeOperator) EnsureHooks(context.Context) error { o.calls++; return o.err }
func (o *fakeOperator) RestartNode(context.Context, string) error {
	return errors.New("the watcher must not restart the node")
}
func (o *fakeOperator) Repave(context.Context, string, string) error {
	return errors.New("the watcher must not repave")
}

// completeHost lays down a complete installation with slot a active and a
// node identity kubeconfig for node1.
func completeHost(t *testing.T) (*hostroot.Root, flags) {
	t.Helper()
	prefix := t.TempDir()
	root, err := hostroot.New(prefix, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := root.EnsureLayout(); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("example.toml", config.Example())
	if err != nil {
		t.Fatal(err)
	}
	rec, err := ownership.New("node1", cfg.Fingerprint(), "test")
	if err != nil {
		t.Fatal(err)
	}
	for _, cp := range ownership.InstallCheckpoints()[1:] {
		if err := rec.SetCheckpoint(cp); err != nil {
			t.Fatal(err)
		}
	}
	if err := ownership.Save(root, rec); err != nil {
		t.Fatal(err)
	}
	a, err := isolation.NewApplied("a", cfg, "test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	st := state.NewStore(root)
	if err := st.SaveApplied(a); err != nil {
		t.Fatal(err)
	}
	if err := st.SetActive("a"); err != nil {
		t.Fatal(err)
	}
	kc := mustPath(t, root, hostroot.IdentityDir, "kubeconfig")
	if err := os.MkdirAll(filepath.Dir(kc), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kc, nodeKubeconfig(t, "node1"), 0o600); err != nil {
		t.Fatal(err)
	}
	return root, flags{LockWait: 2 * time.Second}
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
	root, f := completeHost(t)
	op := &fakeOperator{}
	withOperator(t, op, nil)
	var logs bytes.Buffer
	st, err := start(context.Background(), root, f, slog.New(slog.NewTextHandler(&logs, nil)))
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
			root, f := completeHost(t)
			withOperator(t, c.op, c.buildErr)
			var logs bytes.Buffer
			st, err := start(context.Background(), root, f, slog.New(slog.NewTextHandler(&logs, nil)))
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
	root, f := completeHost(t)
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
	if _, err := start(context.Background(), root, f, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if *built != 0 || op.calls != 0 {
		t.Errorf("operator built %d times, EnsureHooks called %d times from a corrupt applied configuration", *built, op.calls)
	}
}

func TestStartBadSettingsIsUsageError(t *testing.T) {
	root, f := completeHost(t)
	withOperator(t, &fakeOperator{}, nil)
	t.Setenv("KUBESLOT_NODE_KUBELET_PORT", "many")
	_, err := start(context.Background(), root, f, slog.New(slog.DiscardHandler))
	if exitcode.Of(err) != exitcode.Usage || !strings.Contains(fmt.Sprint(err), "many") {
		t.Errorf("err %v (exit %d): want a usage error naming the value", err, exitcode.Of(err))
	}
}

func TestTestExitAfter(t *testing.T) {
	t.Setenv(EnvTestExitAfter, "0s")
	if code, _, errs := clitest.Call(run, "", "--root-prefix", t.TempDir()); code != exitcode.Failure || !strings.Contains(errs, "WARN") || !strings.Contains(errs, EnvTestExitAfter) {
		t.Errorf("%s=0s: exit %d, stderr %q; want 1 and a warning naming the variable", EnvTestExitAfter, code, errs)
	}
	t.Setenv(EnvTestExitAfter, "soon")
	if code, _, errs := clitest.Call(run, "", "--root-prefix", t.TempDir()); code != exitcode.Usage || !strings.Contains(errs, EnvTestExitAfter) || !strings.Contains(errs, "soon") {
		t.Errorf("%s=soon: exit %d, stderr %q; want %d naming the variable and value", EnvTestExitAfter, code, errs, exitcode.Usage)
	}
	for _, v := range []string{"", "5s", "-1s"} {
		d, err := testExitAfter(v)
		switch {
		case v == "" && (d != nil || err != nil):
			t.Errorf("unset: %v %v", d, err)
		case v == "5s" && (d == nil || *d != 5*time.Second || err != nil):
			t.Errorf("5s: %v %v", d, err)
		case v == "-1s" && exitcode.Of(err) != exitcode.Usage:
			t.Errorf("-1s: %v, want a usage error", err)
		}
	}
}
