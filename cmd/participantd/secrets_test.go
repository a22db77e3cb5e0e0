package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Tokens of the tests: strong enough for the start-up check.
const (
	strongToken      = "Xq3v9LzT0bWk7RmN2pYs4HcJ8dFg1aEu"
	otherStrongToken = "7f3a9c2e81b64d05a9e3f7c1d8b2604e"
)

func TestTokenWeakness(t *testing.T) {
	for _, tc := range []struct {
		tok  string
		weak string // a word of the reason, "" when strong
	}{
		{strongToken, ""},
		{otherStrongToken, ""}, // 32 hex digits: 128 bits
		{"7F3A9C2E81B64D05A9E3F7C1D8B2604E", ""},
		{"Yk2_9rTq-Lm4Zx8WbN0cVs", ""},                       // 22 base64url characters: 132 bits
		{"tnVt7hY1IeJQ1Khd1Cg5dCC8mA2x7L6zVjGHTXJp5Nc=", ""}, // openssl rand -base64 32
		{"7f3a9c2e81b64d05a9e3f7c1d8b2604", "bits"},          // 31 hex digits: 124 bits
		{"Yk2_9rTq-Lm4Zx8WbN0cV", "bits"},                    // 21 base64: 126 bits
		{"x", "bits"},                                        // the one-byte token of issue 27
		{"s3cret", "bits"},
		{"replace-me-with-a-long-random-token", "placeholder"}, // the manifests' old placeholder
		{"REPLACE_ME_0123456789abcdefghijklmnopqrstuv", "placeholder"},
		{"change-me-please-9f8e7d6c5b4a3f2e1d0c", "placeholder"},
		{"ChangeMe!ChangeMe!ChangeMe!ChangeMe!", "placeholder"},
		{"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "distinct"}, // 40 characters, 1 distinct
		{"abcdefgh01abcdefgh01abcdefgh01abcdefgh01", "repeats"},
		{"q9Zr2Xw7abcdefghijkT4vM1pL8nK3", "run"},
		{"q9Zr2Xw7T4vM1pL8nK3zzzzzzzzzzz", "run"},
		{"1234567890123456789012345678901234567890", "repeats"}, // 40 digits: 133 bits
	} {
		got := tokenWeakness(tc.tok)
		if (tc.weak == "") != (got == "") || !strings.Contains(got, tc.weak) {
			t.Errorf("tokenWeakness(%q) = %q, want %q", tc.tok, got, tc.weak)
		}
	}
}

// Every token --generate-token makes passes the check (a rare random
// refusal would make operators distrust it).
func TestGenerateToken_PassesTheCheck(t *testing.T) {
	seen := make(map[string]bool)
	for range 2000 {
		tok, err := generateToken()
		if err != nil {
			t.Fatal(err)
		}
		if len(tok) != 43 || seen[tok] {
			t.Fatalf("generateToken = %q (length %d, seen %v), want 43 fresh characters", tok, len(tok), seen[tok])
		}
		seen[tok] = true
		if why := tokenWeakness(tok); why != "" {
			t.Fatalf("generateToken = %q, refused: %s", tok, why)
		}
	}
	var out bytes.Buffer
	if code := run([]string{"--generate-token"}, nil, &out, devNull(t)); code != 0 || tokenWeakness(strings.TrimSpace(out.String())) != "" {
		t.Errorf("participantd --generate-token = exit %d, %q", code, out.String())
	}
}

// Issue 27 item 4: a weak or placeholder auth or admin token is refused at
// start-up, and the refusal names the setting and where it came from.
func TestParseOptions_RefusesWeakTokens(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "admin-token")
	if err := os.WriteFile(file, []byte("replace-me-with-another-long-random-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		args    []string
		environ []string
		want    []string
	}{
		{"flag", []string{"--auth-token", "hunter22"}, nil, []string{"auth-token (from --auth-token)", "bits", "--generate-token", "PARTICIPANTD_AUTH_TOKEN"}},
		{"environment", nil, []string{"PARTICIPANTD_ADMIN_TOKEN=x"}, []string{"admin-token (from PARTICIPANTD_ADMIN_TOKEN)", "bits"}},
		{"file", []string{"--admin-token-file", file}, nil, []string{"admin-token (from " + file + " via --admin-token-file)", "placeholder"}},
		{"etcd placeholder", []string{"--etcd-password", "replace-me-with-the-etcd-password"}, nil, []string{"etcd-password (from --etcd-password)", "placeholder"}},
	} {
		_, err := parseOptions(tc.args, tc.environ, io.Discard)
		if err == nil {
			t.Errorf("%s: parseOptions succeeded, want a refusal", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: parseOptions = %v, want it to name %q", tc.name, err, w)
			}
		}
		if strings.Contains(err.Error(), "hunter22") || strings.Contains(err.Error(), "replace-me-with-another") {
			t.Errorf("%s: the refusal echoes the token: %v", tc.name, err)
		}
	}
	// The real binary refuses too: run exits 2.
	if code := run([]string{"--auth-token", "short", "--version"}, nil, &bytes.Buffer{}, devNull(t)); code != 2 {
		t.Errorf("participantd --auth-token short = exit %d, want 2", code)
	}
}

// A weak etcd password is etcd's to choose: a warning, not a refusal
// (unlike one holding a placeholder word).
func TestParseOptions_WarnsOfAWeakEtcdPassword(t *testing.T) {
	o, err := parseOptions(nil, []string{"PARTICIPANTD_ETCD_PASSWORD=hunter22"}, io.Discard)
	if err != nil {
		t.Fatalf("parseOptions with a weak etcd password = %v, want a start with a warning", err)
	}
	if len(o.warnings) != 1 || !strings.Contains(o.warnings[0], "etcd-password (from PARTICIPANTD_ETCD_PASSWORD) is weak") || strings.Contains(o.warnings[0], "hunter22") {
		t.Errorf("warnings %q, want one naming etcd-password as weak, without the password", o.warnings)
	}
}

// Issue 27 item 5: the cluster secret stored unsealed in etcd is warned
// about at start.
func TestParseOptions_WarnsOfAnUnsealedClusterSecret(t *testing.T) {
	o, err := parseOptions([]string{"--etcd-endpoints", "https://127.0.0.1:2379"}, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.warnings) != 1 || !strings.Contains(o.warnings[0], "unsealed") || !strings.Contains(o.warnings[0], "--etcd-secret-key-file") {
		t.Errorf("cluster mode without a sealing key warned %q, want one warning naming --etcd-secret-key-file", o.warnings)
	}
	key := filepath.Join(t.TempDir(), "seal.key")
	if err := os.WriteFile(key, []byte(otherStrongToken+otherStrongToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err = parseOptions([]string{"--etcd-endpoints", "https://127.0.0.1:2379", "--etcd-secret-key-file", key}, nil, io.Discard)
	if err != nil || len(o.warnings) != 0 {
		t.Errorf("cluster mode with a sealing key: warnings %q, %v; want none", o.warnings, err)
	}
	// The key is read at start: a readable or malformed one fails at once.
	os.Chmod(key, 0o644)
	if _, err := parseOptions([]string{"--etcd-endpoints", "https://127.0.0.1:2379", "--etcd-secret-key-file", key}, nil, io.Discard); err == nil || !strings.Contains(err.Error(), "etcd-secret-key-file") {
		t.Errorf("a sealing key readable by others = %v, want a refusal naming etcd-secret-key-file", err)
	}
}

// Issue 27 item 6: open admission beyond loopback is refused without
// allow-open-admission, as the container image's 0.0.0.0 listener was.
func TestParseOptions_OpenAdmissionBeyondLoopback(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		environ []string
		refused bool
	}{
		{"default loopback", nil, nil, false},
		{"the image's listener", nil, []string{"PARTICIPANTD_LISTEN=0.0.0.0:7420"}, true},
		{"every interface", []string{"--listen", ":7420"}, nil, true},
		{"IPv6", []string{"--listen", "[::]:7420"}, nil, true},
		{"a name", []string{"--listen", "participantd.example:7420"}, nil, true},
		{"localhost", []string{"--listen", "localhost:7420"}, nil, false},
		{"ws beyond loopback", []string{"--ws-listen", "0.0.0.0:7422"}, nil, true},
		{"opted in", []string{"--listen", "0.0.0.0:7420", "--allow-open-admission"}, nil, false},
		{"opted in by the environment", nil, []string{"PARTICIPANTD_LISTEN=0.0.0.0:7420", "PARTICIPANTD_ALLOW_OPEN_ADMISSION=true"}, false},
		{"auth token", []string{"--listen", "0.0.0.0:7420", "--auth-token", strongToken}, nil, false},
		{"invite policy", []string{"--listen", "0.0.0.0:7420", "--enroll-policy", "invite"}, nil, false},
		{"mutual TLS", []string{"--listen", "0.0.0.0:7420", "--tls-client-ca", "/ca.pem"}, nil, false},
	} {
		_, err := parseOptions(tc.args, tc.environ, io.Discard)
		switch {
		case tc.refused && (err == nil || !strings.Contains(err.Error(), "PARTICIPANTD_ALLOW_OPEN_ADMISSION")):
			t.Errorf("%s: parseOptions = %v, want a refusal naming PARTICIPANTD_ALLOW_OPEN_ADMISSION", tc.name, err)
		case !tc.refused && err != nil:
			t.Errorf("%s: parseOptions = %v, want success", tc.name, err)
		}
	}
}

// Issue 27 item 6: the container image, run as shipped (its ENV lines),
// refuses to start with open admission on 0.0.0.0, and starts with a
// token file.
func TestDockerImage_RefusesOpenAdmission(t *testing.T) {
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var environ []string
	inEnv := false
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, "ENV "); ok {
			line, inEnv = rest, true
		} else if !inEnv {
			continue
		}
		inEnv = strings.HasSuffix(line, "\\")
		environ = append(environ, strings.Fields(strings.TrimSuffix(line, "\\"))...)
	}
	if !slices.Contains(environ, "PARTICIPANTD_LISTEN=0.0.0.0:7420") {
		t.Fatalf("the Dockerfile's ENV = %q, want PARTICIPANTD_LISTEN=0.0.0.0:7420 among them", environ)
	}
	if _, err := parseOptions(nil, environ, io.Discard); err == nil || !strings.Contains(err.Error(), "PARTICIPANTD_ALLOW_OPEN_ADMISSION") {
		t.Errorf("the image's environment = %v, want a refusal of open admission", err)
	}
	tok := filepath.Join(t.TempDir(), "auth-token")
	if err := os.WriteFile(tok, []byte(strongToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := parseOptions(nil, append(environ, "PARTICIPANTD_AUTH_TOKEN_FILE="+tok), io.Discard); err != nil {
		t.Errorf("the image's environment with a token file = %v", err)
	}
}
