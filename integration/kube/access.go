package kube

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// User is a static-token identity.
type User struct {
	Name   string
	Groups []string
}

// Groups used by the built-in identities and bootstrap tokens.
const (
	// AgentGroup is the group of the agent-N token identities. It has no
	// permissions until a test binds a role to it.
	AgentGroup = "kubeslot:agents"
	// BootstrapGroup is the extra group of every token from
	// CreateBootstrapToken; Start binds it to node-bootstrapper and to
	// automatic approval of node client CSRs.
	BootstrapGroup = "system:bootstrappers:kubeslot"
)

const tokensFile = "tokens.csv"

// builtinUsers are the static-token identities every control plane has. The
// apiserver reads its token file once, at start, so they are minted up front:
//
//	admin                           system:masters
//	system:node:node-0 … node-9     system:nodes   (what a kubelet presents)
//	agent-0 … agent-9               kubeslot:agents
func builtinUsers() []User {
	us := []User{{Name: "admin", Groups: []string{"system:masters"}}}
	for i := range 10 {
		us = append(us, User{Name: "system:node:node-" + strconv.Itoa(i), Groups: []string{"system:nodes"}})
	}
	for i := range 10 {
		us = append(us, User{Name: "agent-" + strconv.Itoa(i), Groups: []string{AgentGroup}})
	}
	return us
}

// tokenUser is a User with its token.
type tokenUser struct {
	User
	token string
}

// writeTokens writes the apiserver's --token-auth-file for the built-in
// users plus extra, each with a fresh random token.
func writeTokens(path string, extra []User) ([]tokenUser, error) {
	users := append(builtinUsers(), extra...)
	out := make([]tokenUser, 0, len(users))
	var b strings.Builder
	for i, u := range users {
		if u.Name == "" || strings.ContainsAny(u.Name, ",\"\n") {
			return nil, fmt.Errorf("kube: Options.Users: bad user name %q", u.Name)
		}
		for _, g := range u.Groups {
			if strings.ContainsAny(g, ",\"\n") {
				return nil, fmt.Errorf("kube: Options.Users: user %q: bad group %q", u.Name, g)
			}
		}
		tok, err := randomHex(16)
		if err != nil {
			return nil, err
		}
		// token,user,uid,"group1,group2"
		fmt.Fprintf(&b, "%s,%s,%d,\"%s\"\n", tok, u.Name, 1000+i, strings.Join(u.Groups, ","))
		out = append(out, tokenUser{User{Name: u.Name, Groups: slices.Clone(u.Groups)}, tok})
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return nil, fmt.Errorf("kube: %w", err)
	}
	return out, nil
}

// TokenFor returns the static token of a pre-registered user (see
// builtinUsers and Options.Users). With groups, it also checks that the user
// was registered with exactly those groups, so a test cannot silently get a
// different identity than it asked for.
func (c *ControlPlane) TokenFor(user string, groups ...string) (string, error) {
	i := slices.IndexFunc(c.users, func(u tokenUser) bool { return u.Name == user })
	if i < 0 {
		return "", fmt.Errorf("kube: no static token for user %q (tokens exist for admin, system:node:node-0..9, agent-0..9 and Options.Users)", user)
	}
	if len(groups) > 0 {
		have := slices.Sorted(slices.Values(c.users[i].Groups))
		want := slices.Sorted(slices.Values(groups))
		if !slices.Equal(have, want) {
			return "", fmt.Errorf("kube: user %q has groups %v, not %v", user, have, want)
		}
	}
	return c.users[i].token, nil
}

// NodeClientCert issues a client certificate for a kubelet of node:
// CN=system:node:<node>, O=system:nodes, signed by the cluster CA.
func (c *ControlPlane) NodeClientCert(node string) (certPEM, keyPEM []byte, err error) {
	if node == "" {
		return nil, nil, fmt.Errorf("kube: NodeClientCert: empty node name")
	}
	return c.pki.clientCert("system:node:"+node, "system:nodes")
}

// ClientCert issues a client certificate for any user and groups.
func (c *ControlPlane) ClientCert(user string, groups ...string) (certPEM, keyPEM []byte, err error) {
	return c.pki.clientCert(user, groups...)
}

// AdminConfig is a client configuration authenticated as system:masters. Each
// call returns a new copy the caller may change.
func (c *ControlPlane) AdminConfig() *rest.Config {
	cfg := c.baseConfig()
	cfg.CertFile = c.pki.path(adminCertFile)
	cfg.KeyFile = c.pki.path(adminKeyFile)
	return cfg
}

// TokenConfig is a client configuration that presents token.
func (c *ControlPlane) TokenConfig(token string) *rest.Config {
	cfg := c.baseConfig()
	cfg.BearerToken = token
	return cfg
}

// CertConfig is a client configuration that presents a client certificate.
func (c *ControlPlane) CertConfig(certPEM, keyPEM []byte) *rest.Config {
	cfg := c.baseConfig()
	cfg.CertData, cfg.KeyData = certPEM, keyPEM
	return cfg
}

func (c *ControlPlane) baseConfig() *rest.Config {
	return &rest.Config{
		Host:            c.url,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.CAPEM()},
		QPS:             200, Burst: 400,
		Timeout: 30 * time.Second,
	}
}

// AdminKubeconfig is the path of a kubeconfig file for the admin identity
// (for kubectl while debugging: it lives in Dir).
func (c *ControlPlane) AdminKubeconfig() string { return filepath.Join(c.dir, "admin.kubeconfig") }

func (c *ControlPlane) adminKubeconfig() []byte {
	return c.KubeconfigCert("admin", c.pki.adminCert, c.pki.adminKey)
}

// Kubeconfig returns a self-contained kubeconfig (CA embedded) for the
// apiserver that authenticates with token under the name user.
func (c *ControlPlane) Kubeconfig(user, token string) []byte {
	return c.kubeconfig(user, &clientcmdapi.AuthInfo{Token: token})
}

// KubeconfigCert returns a self-contained kubeconfig that authenticates with
// a client certificate.
func (c *ControlPlane) KubeconfigCert(user string, certPEM, keyPEM []byte) []byte {
	return c.kubeconfig(user, &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM})
}

func (c *ControlPlane) kubeconfig(user string, auth *clientcmdapi.AuthInfo) []byte {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["rig"] = &clientcmdapi.Cluster{Server: c.url, CertificateAuthorityData: c.CAPEM()}
	cfg.AuthInfos[user] = auth
	cfg.Contexts["rig"] = &clientcmdapi.Context{Cluster: "rig", AuthInfo: user}
	cfg.CurrentContext = "rig"
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		// Write only fails on unserialisable input, which the fields above
		// cannot be: a bug here, not the caller's problem to handle
		panic(fmt.Sprintf("kube: serialise kubeconfig: %v", err))
	}
	return b
}

// createBootstrapRBAC binds, once per control plane, what a kubelet with a
// bootstrap token needs: create a CSR (system:node-bootstrapper), have its
// node-client CSR approved automatically, and later renew its own
// certificate (selfnodeclient, for group system:nodes).
func (c *ControlPlane) createBootstrapRBAC(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(c.AdminConfig())
	if err != nil {
		return fmt.Errorf("kube: client: %w", err)
	}
	bind := func(name, role, group string) error {
		crb := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: group}},
		}
		_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("kube: create ClusterRoleBinding %s: %w", name, err)
		}
		return nil
	}
	const csr = "system:certificates.k8s.io:certificatesigningrequests:"
	if err := bind("kubeslot:bootstrappers:node-bootstrapper", "system:node-bootstrapper", BootstrapGroup); err != nil {
		return err
	}
	if err := bind("kubeslot:bootstrappers:nodeclient", csr+"nodeclient", BootstrapGroup); err != nil {
		return err
	}
	return bind("kubeslot:nodes:selfnodeclient", csr+"selfnodeclient", "system:nodes")
}

// CreateBootstrapToken creates a bootstrap token valid for ttl (a
// bootstrap-token-<id> Secret in kube-system, extra group BootstrapGroup) and
// returns it as "<id>.<secret>". It returns once the apiserver accepts the
// token: its authenticator reads Secrets through a cache that lags the write.
func (c *ControlPlane) CreateBootstrapToken(ctx context.Context, ttl time.Duration) (string, error) {
	cs, err := kubernetes.NewForConfig(c.AdminConfig())
	if err != nil {
		return "", fmt.Errorf("kube: client: %w", err)
	}
	id, err := randomToken(6)
	if err != nil {
		return "", err
	}
	secret, err := randomToken(16)
	if err != nil {
		return "", err
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-" + id, Namespace: metav1.NamespaceSystem},
		Type:       corev1.SecretTypeBootstrapToken,
		StringData: map[string]string{
			"token-id":                       id,
			"token-secret":                   secret,
			"expiration":                     time.Now().Add(ttl).UTC().Format(time.RFC3339),
			"usage-bootstrap-authentication": "true",
			"auth-extra-groups":              BootstrapGroup,
		},
	}
	if _, err := cs.CoreV1().Secrets(metav1.NamespaceSystem).Create(ctx, s, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("kube: create Secret kube-system/%s: %w", s.Name, err)
	}
	token := id + "." + secret
	tc, err := kubernetes.NewForConfig(c.TokenConfig(token))
	if err != nil {
		return "", fmt.Errorf("kube: client: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	for {
		_, err := tc.AuthenticationV1().SelfSubjectReviews().Create(wctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err == nil {
			return token, nil
		}
		select {
		case <-wctx.Done():
			return "", fmt.Errorf("kube: bootstrap token %s not accepted after 15s: %v", id, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// randomToken returns n characters of [a-z0-9], the bootstrap token alphabet.
func randomToken(n int) (string, error) {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("kube: random: %w", err)
	}
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)] // slight bias: fine for tests
	}
	return string(b), nil
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("kube: random: %w", err)
	}
	return hex.EncodeToString(b), nil
}
