package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// credsDirHelp says where a bare --creds name goes.
const credsDirHelp = "a bare name (no directory) is a file in the per-user directory $PARTICIPANTCTL_CREDS_DIR, else the user's config directory's participantctl/ (e.g. ~/.config/participantctl/), created 0700"

// credsFlag is --creds: a path with a directory part (./alice.json,
// /srv/alice.json) is used as given; a bare name goes to the per-user
// credentials directory, so that credentials do not scatter over whatever
// directory the command ran in.
type credsFlag struct {
	e    *env
	path *string
}

func (c credsFlag) String() string {
	if c.path == nil {
		return ""
	}
	return *c.path
}

// Type names the value in --help (pflag.Value).
func (c credsFlag) Type() string { return "file" }

func (c credsFlag) Set(v string) error {
	p, err := resolveCreds(c.e, v)
	if err != nil {
		return err
	}
	*c.path = p
	return nil
}

// resolveCreds returns where the credential file named v lives, creating
// the per-user directory when a bare name needs it.
func resolveCreds(e *env, v string) (string, error) {
	if v == "" || filepath.IsAbs(v) || strings.ContainsRune(v, filepath.Separator) || strings.ContainsRune(v, '/') {
		return v, nil
	}
	dir, err := credsDir(e)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("credentials directory: %w", err)
	}
	return filepath.Join(dir, v), nil
}

// credsDir is the per-user credentials directory.
func credsDir(e *env) (string, error) {
	if d := e.getenv("PARTICIPANTCTL_CREDS_DIR"); d != "" {
		return d, nil
	}
	base, err := os.UserConfigDir()
	if err != nil {
		return "", errors.Join(errors.New("no per-user config directory for a bare --creds name; give a path such as ./creds.json or set PARTICIPANTCTL_CREDS_DIR"), err)
	}
	return filepath.Join(base, "participantctl"), nil
}
