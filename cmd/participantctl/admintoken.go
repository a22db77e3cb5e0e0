package main

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/participantd/participantd/internal/cli"
	"github.com/participantd/participantd/server"
)

// adminToken returns the admin token to present to the health listener
// health: flag (--admin-token) if set, else $PARTICIPANTCTL_ADMIN_TOKEN,
// else, when health is a loopback address, the token a participantd with
// a loopback health listener generated and wrote to its data directory's
// server.AdminTokenFile (dataDir, --data). The file is never read for a
// listener beyond loopback: its token opens this host's server only, and
// is not sent elsewhere. The error is a usage error saying each source.
func adminToken(e *env, flag, health, dataDir string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if t := e.getenv(adminTokenEnv); t != "" {
		return t, nil
	}
	missing := func(why string) error {
		return &cli.ExitError{Code: cli.ExitUsage, Err: fmt.Errorf(
			"an admin token is required: --admin-token, $%s, or the %s file a participantd with a loopback health listener writes in its data directory (--data DIR): %s",
			adminTokenEnv, server.AdminTokenFile, why)}
	}
	if !loopbackHealth(health) {
		return "", missing(fmt.Sprintf("--health %s is not a loopback address, so no local file is used", health))
	}
	path := filepath.Join(dataDir, server.AdminTokenFile)
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", missing(path + " does not exist (is participantd running with --data " + dataDir + "?)")
	case err != nil:
		return "", missing(err.Error())
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", missing(path + " is empty")
	}
	return t, nil
}

// loopbackHealth reports whether the health listener address (host:port
// or a URL) names a loopback host: localhost or a loopback IP.
func loopbackHealth(health string) bool {
	host := health
	if strings.Contains(health, "://") {
		u, err := url.Parse(health)
		if err != nil {
			return false
		}
		host = u.Host
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
