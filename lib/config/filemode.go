package config

import (
	"fmt"
	"io/fs"
	"os"
)

// HoldsSecret reports whether c carries a secret (the join token), so that
// the file it came from must be readable by its owner only.
func (c *Config) HoldsSecret() bool { return c.Cluster.BootstrapToken != "" }

// ExposedMode returns the mode of the configuration file at path and
// whether it lets anyone but its owner read or write it while c holds a
// secret. A file that cannot be stat'ed is an error.
func ExposedMode(path string, c *Config) (fs.FileMode, bool, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, false, fmt.Errorf("stat config %s: %w", path, err)
	}
	return fi.Mode().Perm(), c.HoldsSecret() && fi.Mode().Perm()&0o077 != 0, nil
}

// ExposureWarning is the message for a configuration whose file others can
// read: it names the file, its mode and the remedy, never the secret.
func ExposureWarning(path string, mode fs.FileMode) string {
	return fmt.Sprintf("%s has mode %04o: readable by others, yet it holds the join token (cluster.bootstrap_token); chmod 600 %s", path, mode, path)
}
