package main

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"math"
	"net"
	"strings"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/participant"
)

// MinTokenBits is the least entropy, in bits, an auth or admin token must
// be able to hold: what 16 random bytes give, beyond the reach of guessing
// at any rate the listeners allow.
const MinTokenBits = 128

// generatedTokenBytes is how many random bytes --generate-token draws.
const generatedTokenBytes = 32

// generateToken returns 32 bytes from the system's secure generator,
// base64url without padding (43 characters, 256 bits).
func generateToken() (string, error) {
	b := make([]byte, generatedTokenBytes)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// placeholders are words that a token copied from a manifest, an example or
// a default holds: a token containing one (case, '-', '_', '.' and spaces
// aside) is refused whatever its length. Each is at least five letters, so
// that a random base64 token of 43 characters holds one by chance about
// once in a million.
var placeholders = []string{
	"replaceme", "changeme", "placeholder", "example", "password",
	"yourtoken", "yoursecret", "secret", "token", "insecure",
}

// tokenWeakness says why tok cannot be a token of MinTokenBits, or "" when
// it can be. The measure is an upper bound, what the string could hold if
// each character were drawn at random from the smallest usual alphabet
// containing all of its characters (digits 3.3 bits a character, hex 4,
// letters and digits up to 5.95, base64 6, any printable 6.6): a random
// token of 32 hex digits or 22 base64 characters passes. On top of it a
// token is refused when it holds a placeholder word, repeats a shorter
// string, uses fewer than 8 distinct characters, or holds a run of 8 equal
// or consecutive characters ("aaaaaaaa", "12345678"): a random token does
// any of these about once in a million. What it cannot tell is a phrase a
// person chose from a random string of the same alphabet; generate tokens
// (participantd --generate-token, openssl rand -base64 32).
func tokenWeakness(tok string) string {
	if why := placeholderIn(tok); why != "" {
		return why
	}
	alphabet, name := tokenAlphabet(tok)
	if bits := float64(len(tok)) * math.Log2(float64(alphabet)); bits < MinTokenBits {
		return fmt.Sprintf("%d characters of %s hold at most %.0f bits, want %d (%d characters of it)",
			len(tok), name, bits, MinTokenBits, int(math.Ceil(MinTokenBits/math.Log2(float64(alphabet)))))
	}
	distinct := make(map[rune]bool)
	for _, r := range tok {
		distinct[r] = true
	}
	if len(distinct) < 8 {
		return fmt.Sprintf("it uses %d distinct characters, want at least 8", len(distinct))
	}
	if strings.Contains((tok + tok)[1:2*len(tok)-1], tok) {
		return "it repeats a shorter string"
	}
	if run := longestRun(tok); run >= 8 {
		return fmt.Sprintf("it holds a run of %d equal or consecutive characters", run)
	}
	return ""
}

// placeholderIn says which placeholder word tok holds, "" when none.
func placeholderIn(tok string) string {
	norm := strings.NewReplacer("-", "", "_", "", ".", "", " ", "").Replace(strings.ToLower(tok))
	for _, w := range placeholders {
		if strings.Contains(norm, w) {
			return fmt.Sprintf("it holds the placeholder word %q", w)
		}
	}
	return ""
}

// tokenAlphabet returns the size and name of the smallest usual alphabet
// holding every character of tok.
func tokenAlphabet(tok string) (int, string) {
	var digit, lower, upper, nonHexLower, nonHexUpper, b64, other bool
	for _, r := range tok {
		switch {
		case r >= '0' && r <= '9':
			digit = true
		case r >= 'a' && r <= 'z':
			lower, nonHexLower = true, nonHexLower || r > 'f'
		case r >= 'A' && r <= 'Z':
			upper, nonHexUpper = true, nonHexUpper || r > 'F'
		case r == '+' || r == '/' || r == '-' || r == '_' || r == '=':
			b64 = true
		default:
			other = true
		}
	}
	switch {
	case other:
		return 95, "printable characters"
	case b64:
		return 64, "base64"
	case !lower && !upper:
		return 10, "digits"
	case lower && !upper && !nonHexLower, upper && !lower && !nonHexUpper:
		return 16, "hex digits"
	}
	n, names := 0, []string(nil)
	if digit {
		n, names = n+10, append(names, "digits")
	}
	if lower {
		n, names = n+26, append(names, "lower-case letters")
	}
	if upper {
		n, names = n+26, append(names, "upper-case letters")
	}
	return n, strings.Join(names, " and ")
}

// longestRun is the length of tok's longest run of equal characters or of
// characters each one above, or each one below, the one before.
func longestRun(tok string) int {
	best := min(len(tok), 1)
	for _, step := range []int{0, 1, -1} {
		run := 1
		for i := 1; i < len(tok); i++ {
			if int(tok[i])-int(tok[i-1]) == step {
				run++
				best = max(best, run)
			} else {
				run = 1
			}
		}
	}
	return best
}

// checkSecrets refuses an auth or admin token that tokenWeakness finds
// weak, and an etcd password holding a placeholder word, naming the
// setting and where it came from; a weak etcd password (etcd's to choose)
// is a warning. It adds the warnings the secrets call for: the cluster
// secret stored unsealed.
func checkSecrets(o *options, from map[string]string) error {
	for _, s := range []struct {
		name string
		v    string
	}{{"auth-token", o.server.AuthToken}, {"admin-token", o.server.AdminToken}, {"etcd-password", o.server.Cluster.Password}} {
		if s.v == "" {
			continue
		}
		why := tokenWeakness(s.v)
		if why == "" {
			continue
		}
		if s.name == "etcd-password" && placeholderIn(s.v) == "" {
			o.warnings = append(o.warnings, fmt.Sprintf("etcd-password (from %s) is weak: %s; whoever guesses it reads every conversation and the cluster secret", from[s.name], why))
			continue
		}
		return fmt.Errorf("%s (from %s) is refused: %s. Generate one with `participantd --generate-token` (or `openssl rand -base64 32`) and give it as %s-file or %s",
			s.name, from[s.name], why, s.name, envName(s.name))
	}
	for _, k := range []struct{ name, path string }{
		{"etcd-secret-key-file", o.server.Cluster.SealKeyFile}, {"etcd-previous-secret-key-file", o.server.Cluster.PreviousSealKeyFile},
	} {
		if k.path == "" {
			continue
		}
		// Read now, so that a wrong mode or format fails the start (and
		// --version) at once, not once etcd answers.
		if _, err := cluster.LoadSealKey(k.path); err != nil {
			return fmt.Errorf("%s: %w", k.name, err)
		}
	}
	if len(o.server.Cluster.Endpoints) > 0 && o.server.Cluster.SealKeyFile == "" {
		o.warnings = append(o.warnings, "the cluster secret (secret/node-key, from which every participant secret derives) is stored unsealed in etcd: whoever reads etcd's key space or one of its backups can forge any credential; set --etcd-secret-key-file (a 0600 file of 64 hex digits: openssl rand -hex 32), the same on every node")
	}
	return nil
}

// checkOpenAdmission refuses a wire or WebSocket listener beyond loopback
// through which anyone may enroll (no auth token, no client certificates,
// the open enroll policy) unless allow-open-admission says the operator
// means it: a container or a manifest that listens on every interface
// must not serve every conversation to whoever finds the port.
func checkOpenAdmission(o *options) error {
	if o.allowOpenAdmission || o.server.AuthToken != "" || o.server.TLSClientCA != "" ||
		o.server.EnrollPolicy != participant.EnrollOpen {
		return nil
	}
	for _, l := range []struct{ name, addr string }{{"listen", o.server.Listen}, {"ws-listen", o.server.WSListen}} {
		if l.addr != "" && !loopbackAddr(l.addr) {
			return fmt.Errorf("%s %s is beyond loopback with no auth token and the open enroll policy: anyone who can connect could enroll into any conversation and read it. "+
				"Set auth-token-file (participantd --generate-token makes one), or enroll-policy invite, or tls-client-ca; or set allow-open-admission (%s=true) to mean it",
				l.name, l.addr, envName("allow-open-admission"))
		}
	}
	return nil
}

// loopbackAddr reports whether a listen address host:port is on loopback
// only: a loopback IP literal or localhost. An empty host or an
// unspecified address listens on every interface; another name is taken
// to be beyond loopback.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
