package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// Components are the binaries a full rig needs (scripts/kube-bins.sh builds them).
var Components = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kubelet"}

// BinDir returns the directory holding Components: $KUBESLOT_KUBE_BIN when
// set, else the output of scripts/kube-bins.sh, which reuses its cache (fast)
// or builds what is missing (~16 minutes on a cold 2-core machine; its
// progress goes to stderr).
func BinDir(ctx context.Context) (string, error) {
	if d := os.Getenv("KUBESLOT_KUBE_BIN"); d != "" {
		return d, checkBins(d)
	}
	script, err := RepoFile("scripts/kube-bins.sh")
	if err != nil {
		return "", err
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, script)
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("kube: %s: %w", script, err)
	}
	d := lastLine(out.String())
	if d == "" {
		return "", fmt.Errorf("kube: %s printed no directory", script)
	}
	return d, checkBins(d)
}

// CachedBinDir is BinDir without building: $KUBESLOT_KUBE_BIN, else the
// cache directory scripts/kube-bins.sh would print, if every component there
// is complete. It reads the versions from the script's defaults, so the two
// cannot drift apart.
func CachedBinDir() (string, error) {
	if d := os.Getenv("KUBESLOT_KUBE_BIN"); d != "" {
		return d, checkBins(d)
	}
	return cachedDir("KUBE_VERSION", Components)
}

// PrevKubeletDir returns the directory holding the kubelet of the earlier
// Kubernetes release the version-upgrade test starts a node on:
// $KUBESLOT_KUBE_BIN_PREV when set, else scripts/kube-bins.sh --prev's
// cache, built when build is true (a few minutes on a cold machine).
func PrevKubeletDir(ctx context.Context, build bool) (string, error) {
	d := os.Getenv("KUBESLOT_KUBE_BIN_PREV")
	if d == "" && !build {
		return cachedDir("KUBE_PREV_VERSION", []string{"kubelet"})
	}
	if d == "" {
		script, err := RepoFile("scripts/kube-bins.sh")
		if err != nil {
			return "", err
		}
		var out bytes.Buffer
		cmd := exec.CommandContext(ctx, script, "--prev", "kubelet")
		cmd.Stdout, cmd.Stderr = &out, os.Stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("kube: %s --prev kubelet: %w", script, err)
		}
		d = lastLine(out.String())
	}
	if fi, err := os.Stat(filepath.Join(d, "kubelet")); err != nil || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("kube: %s lacks kubelet", d)
	}
	return d, nil
}

// cachedDir is the cache directory scripts/kube-bins.sh prints for the
// Kubernetes version in the script's variable kubeVar, when comps are
// complete there.
func cachedDir(kubeVar string, comps []string) (string, error) {
	script, err := RepoFile("scripts/kube-bins.sh")
	if err != nil {
		return "", err
	}
	src, err := os.ReadFile(script)
	if err != nil {
		return "", fmt.Errorf("kube: %w", err)
	}
	version := func(name string) (string, error) {
		if v := os.Getenv(name); v != "" {
			return v, nil
		}
		m := regexp.MustCompile(name + `=\$\{` + name + `:-([0-9.]+)\}`).FindSubmatch(src)
		if m == nil {
			return "", fmt.Errorf("kube: no default %s in %s", name, script)
		}
		return string(m[1]), nil
	}
	kv, err := version(kubeVar)
	if err != nil {
		return "", err
	}
	ev, err := version("ETCD_VERSION")
	if err != nil {
		return "", err
	}
	cache := os.Getenv("KUBESLOT_CACHE")
	if cache == "" {
		base := os.Getenv("XDG_CACHE_HOME")
		if base == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return "", fmt.Errorf("kube: %w", err)
			}
			base = filepath.Join(home, ".cache")
		}
		cache = filepath.Join(base, "kubeslot")
	}
	d := filepath.Join(cache, "bin", "k8s-"+kv+"-etcd-"+ev)
	for _, c := range comps {
		// the script's completion stamp: a binary without it may be half-written
		if _, err := os.Stat(filepath.Join(d, "."+c+".ok")); err != nil {
			return "", fmt.Errorf("kube: %s not built yet in %s (run scripts/kube-bins.sh)", c, d)
		}
	}
	if kubeVar != "KUBE_VERSION" {
		return d, nil
	}
	return d, checkBins(d)
}

func checkBins(d string) error {
	var missing []string
	for _, c := range Components {
		if fi, err := os.Stat(filepath.Join(d, c)); err != nil || fi.Mode()&0o111 == 0 {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("kube: %s lacks %s", d, strings.Join(missing, ", "))
	}
	return nil
}

// RepoFile returns the absolute path of rel in this repository, found by
// walking up from the working directory (a test's is its package directory)
// to the go.mod of module github.com/kubeslot/kubeslot.
func RepoFile(rel string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("kube: %w", err)
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(b, []byte("module github.com/kubeslot/kubeslot\n")) {
			p := filepath.Join(dir, filepath.FromSlash(rel))
			if _, err := os.Stat(p); err != nil {
				return "", fmt.Errorf("kube: %w", err)
			}
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("kube: not inside the kubeslot repository (no go.mod of github.com/kubeslot/kubeslot above the working directory)")
		}
		dir = parent
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
