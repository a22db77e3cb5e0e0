package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/server"
)

func TestParseOptions_Defaults(t *testing.T) {
	o, err := parseOptions(nil, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s := o.server
	if s.DataDir != "data" || s.Listen != "127.0.0.1:7420" || s.HealthListen != "127.0.0.1:7421" ||
		s.MaxFrame != 1<<20 || s.MaxRecordBytes != 512<<10 || s.ReceiptTTL != 24*time.Hour ||
		s.DrainTimeout != 10*time.Second || o.logLevel != zerolog.InfoLevel || s.AuthToken != "" {
		t.Errorf("defaults = %+v level %v", s, o.logLevel)
	}
}

func TestParseOptions_Precedence(t *testing.T) {
	file := filepath.Join(t.TempDir(), "participantd.conf")
	os.WriteFile(file, []byte("# comment\n\nlisten = 127.0.0.1:1\nhealth-listen = 127.0.0.1:2\ndata = /from/file\nlog-level = debug\n"), 0o600)
	o, err := parseOptions(
		[]string{"--listen", "127.0.0.1:3", "--config", file},
		[]string{"PARTICIPANTD_LISTEN=127.0.0.1:4", "PARTICIPANTD_HEALTH_LISTEN=127.0.0.1:5", "HOME=/x"},
		io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s := o.server
	if s.Listen != "127.0.0.1:3" { // flag beats env and file
		t.Errorf("listen = %s", s.Listen)
	}
	if s.HealthListen != "127.0.0.1:5" { // env beats file
		t.Errorf("health-listen = %s", s.HealthListen)
	}
	if s.DataDir != "/from/file" || o.logLevel != zerolog.DebugLevel { // file beats default
		t.Errorf("data = %s, log-level = %v", s.DataDir, o.logLevel)
	}
	// The config file may come from the environment too.
	o, err = parseOptions(nil, []string{"PARTICIPANTD_CONFIG=" + file}, io.Discard)
	if err != nil || o.server.Listen != "127.0.0.1:1" {
		t.Errorf("config from env: listen = %s, err %v", o.server.Listen, err)
	}
}

func TestParseOptions_ErrorsNameTheKey(t *testing.T) {
	dir := t.TempDir()
	badFile := filepath.Join(dir, "bad.conf")
	os.WriteFile(badFile, []byte("listen = :1\nlisten-port = 3\n"), 0o600)
	for _, tc := range []struct {
		name    string
		args    []string
		env     []string
		wantErr string
	}{
		{"unknown env", nil, []string{"PARTICIPANTD_LISTN=x"}, "PARTICIPANTD_LISTN"},
		{"unknown file key", []string{"--config", badFile}, nil, "listen-port"},
		{"missing file", []string{"--config", filepath.Join(dir, "nope")}, nil, "--config"},
		{"bad int flag", []string{"--max-frame", "big"}, nil, "max-frame"},
		{"bad duration env", nil, []string{"PARTICIPANTD_DRAIN_TIMEOUT=soon"}, "PARTICIPANTD_DRAIN_TIMEOUT"},
		{"bad level", []string{"--log-level", "loud"}, nil, "log-level"},
		{"unknown flag", []string{"--lisen", "x"}, nil, "lisen"},
		{"argument", []string{"serve"}, nil, "serve"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseOptions(tc.args, tc.env, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("parseOptions = %v, want an error naming %q", err, tc.wantErr)
			}
		})
	}
}

func TestParseOptions_HelpListsEverySetting(t *testing.T) {
	var b strings.Builder
	if _, err := parseOptions([]string{"--help"}, nil, &b); err != errHelp {
		t.Fatalf("--help: err = %v", err)
	}
	for _, s := range settings {
		if !strings.Contains(b.String(), "--"+s.name) || !strings.Contains(b.String(), envName(s.name)) {
			t.Errorf("--help lacks %s", s.name)
		}
	}
}

func TestParseOptions_AuthTokenNeverEchoed(t *testing.T) {
	_, err := parseOptions([]string{"--max-frame", "x", "--auth-token", "hunter2"}, nil, io.Discard)
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("err = %v", err)
	}
}

func TestParseOptions_AdmissionAndQuotas(t *testing.T) {
	o, err := parseOptions(nil, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s := o.server; s.EnrollPolicy != participant.EnrollOpen || s.MaxConversations != 0 /* auto: sized to the machine */ ||
		s.MaxDataBytes != server.DefaultMaxDataBytes {
		t.Errorf("defaults: enroll policy %q, max conversations %d, max data bytes %d", s.EnrollPolicy, s.MaxConversations, s.MaxDataBytes)
	}
	o, err = parseOptions([]string{"--enroll-policy", "invite", "--max-conversations", "10", "--max-data-bytes", "1048576"}, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s := o.server; s.EnrollPolicy != participant.EnrollInvite || s.MaxConversations != 10 || s.MaxDataBytes != 1<<20 {
		t.Errorf("given: enroll policy %q, max conversations %d, max data bytes %d", s.EnrollPolicy, s.MaxConversations, s.MaxDataBytes)
	}
	for _, args := range [][]string{{"--enroll-policy", "closed"}, {"--max-data-bytes", "0"}, {"--max-conversations", "-1"}} {
		if _, err := parseOptions(args, nil, io.Discard); err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("parseOptions(%q) = %v, want an error naming %s", args, err, args[0])
		}
	}
}

func TestParseOptions_EtcdLeaderAffinity(t *testing.T) {
	for _, c := range []struct {
		args []string
		off  bool
	}{
		{nil, false},
		{[]string{"--etcd-leader-affinity"}, false},
		{[]string{"--etcd-leader-affinity=false"}, true},
	} {
		o, err := parseOptions(c.args, nil, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if got := o.server.Cluster.NoLeaderAffinity; got != c.off {
			t.Errorf("%v: NoLeaderAffinity = %v, want %v", c.args, got, c.off)
		}
	}
	if _, err := parseOptions([]string{"--etcd-leader-affinity=maybe"}, nil, io.Discard); err == nil {
		t.Error("--etcd-leader-affinity=maybe accepted")
	}
}

func TestParseOptions_PipelineBatches(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  []string
		off  bool
	}{
		{nil, nil, false},
		{[]string{"--pipeline-batches"}, nil, false},
		{[]string{"--pipeline-batches=false"}, nil, true},
		{nil, []string{"PARTICIPANTD_PIPELINE_BATCHES=false"}, true},
	} {
		o, err := parseOptions(c.args, c.env, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if got := o.server.NoPipeline; got != c.off {
			t.Errorf("%v %v: NoPipeline = %v, want %v", c.args, c.env, got, c.off)
		}
	}
	if _, err := parseOptions([]string{"--pipeline-batches=maybe"}, nil, io.Discard); err == nil || !strings.Contains(err.Error(), "pipeline-batches") {
		t.Errorf("--pipeline-batches=maybe = %v, want an error naming pipeline-batches", err)
	}
}

func TestParseOptions_TokenWindow(t *testing.T) {
	o, err := parseOptions(nil, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s := o.server; s.TokenWindow != 0 || s.TokenSkew != participant.DefaultTokenSkew {
		t.Errorf("defaults: token-window %v, token-skew %v; want 0 (off) and %v", s.TokenWindow, s.TokenSkew, participant.DefaultTokenSkew)
	}
	file := filepath.Join(t.TempDir(), "participantd.conf")
	if err := os.WriteFile(file, []byte("token-window = 2h\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name         string
		args, env    []string
		window, skew time.Duration
	}{
		{"flags", []string{"--token-window", "10m", "--token-skew", "30s"}, nil, 10 * time.Minute, 30 * time.Second},
		{"env", nil, []string{"PARTICIPANTD_TOKEN_WINDOW=1h", "PARTICIPANTD_TOKEN_SKEW=2m"}, time.Hour, 2 * time.Minute},
		{"config file", []string{"--config", file}, nil, 2 * time.Hour, participant.DefaultTokenSkew},
		{"explicitly off", []string{"--token-window", "0"}, nil, 0, participant.DefaultTokenSkew},
		// A window below the skew is a valid, if odd, choice: the skew
		// bounds the future, the window the past.
		{"window below skew", []string{"--token-window", "10s", "--token-skew", "1m"}, nil, 10 * time.Second, time.Minute},
	} {
		o, err := parseOptions(c.args, c.env, io.Discard)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if s := o.server; s.TokenWindow != c.window || s.TokenSkew != c.skew {
			t.Errorf("%s: token-window %v, token-skew %v; want %v, %v", c.name, s.TokenWindow, s.TokenSkew, c.window, c.skew)
		}
	}
	for _, c := range []struct {
		args, env []string
		wantErr   string
	}{
		{[]string{"--token-window", "-1m"}, nil, "token-window"},
		{[]string{"--token-window", "soon"}, nil, "token-window"},
		{nil, []string{"PARTICIPANTD_TOKEN_SKEW=-5s"}, "PARTICIPANTD_TOKEN_SKEW"},
		{[]string{"--token-skew", "0"}, nil, "token-skew"},
	} {
		if _, err := parseOptions(c.args, c.env, io.Discard); err == nil || !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("parseOptions(%q, %q) = %v, want an error naming %s", c.args, c.env, err, c.wantErr)
		}
	}
}

// Issue 18 item 4: every secret can come from a file, so that none need be
// on the command line, where every local user reads it.
func TestParseOptions_SecretsFromFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(content), 0o600)
		return p
	}
	auth, admin, etcd := write("auth", strongToken+"\n"), write("admin", otherStrongToken+"\r\n"), write("etcd", "pw")
	o, err := parseOptions([]string{"--auth-token-file", auth, "--etcd-password-file", etcd},
		[]string{"PARTICIPANTD_ADMIN_TOKEN_FILE=" + admin}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.server.AuthToken != strongToken || o.server.AdminToken != otherStrongToken || o.server.Cluster.Password != "pw" {
		t.Errorf("secrets from files = %q, %q, %q; want %s, %s, pw", o.server.AuthToken, o.server.AdminToken, o.server.Cluster.Password, strongToken, otherStrongToken)
	}
	// Only the weak etcd password ("pw", etcd's to choose) is warned about.
	if len(o.warnings) != 1 || !strings.Contains(o.warnings[0], "etcd-password") || strings.Contains(o.warnings[0], "pw ") {
		t.Errorf("secrets from files warned %q, want one warning about the weak etcd-password", o.warnings)
	}
	for _, e := range o.effective {
		if strings.Contains(e.value, strongToken) || strings.Contains(e.value, otherStrongToken) || e.value == "pw" {
			t.Errorf("the effective configuration shows a secret: %s = %q", e.name, e.value)
		}
	}
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"both", []string{"--auth-token", "x", "--auth-token-file", auth}, "both"},
		{"missing", []string{"--admin-token-file", filepath.Join(dir, "nope")}, "admin-token-file"},
		{"empty", []string{"--etcd-password-file", write("empty", "\n")}, "empty"},
	} {
		if _, err := parseOptions(tc.args, nil, io.Discard); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: parseOptions = %v, want an error naming %q", tc.name, err, tc.wantErr)
		}
	}
	o, err = parseOptions([]string{"--auth-token", strongToken}, nil, io.Discard)
	if err != nil || len(o.warnings) != 1 || !strings.Contains(o.warnings[0], "--auth-token-file") || strings.Contains(o.warnings[0], strongToken) {
		t.Errorf("--auth-token on the command line: warnings %q, %v; want one naming --auth-token-file, without the token", o.warnings, err)
	}
}

// The new exposure settings parse from flags, the environment and files
// alike, and their defaults keep a bare start working.
func TestParseOptions_ExposureSettings(t *testing.T) {
	o, err := parseOptions(nil, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s := o.server; s.IdleTimeout != server.DefaultIdleTimeout || s.MaxConnectionsPerAddress != server.DefaultMaxConnectionsPerAddress ||
		s.ConnectionRate != server.DefaultConnectionRate || s.FrameReadTimeout != server.DefaultFrameReadTimeout ||
		s.ConversationRate != server.DefaultConversationRate || s.ConversationBurst != server.DefaultConversationBurst ||
		s.AdminRemote || s.LimitLoopback || s.HealthHosts != nil {
		t.Errorf("defaults = %+v", s)
	}
	file := filepath.Join(t.TempDir(), "participantd.conf")
	if err := os.WriteFile(file, []byte("ws-allowed-origins = app.example.com, *.example.com\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err = parseOptions([]string{"--idle-timeout", "0", "--connection-rate", "2.5", "--conversation-rate", "0.5", "--conversation-burst", "3", "--limit-loopback", "--health-hosts", "a.internal, b.internal",
		"--max-connections-per-address", "7", "--frame-read-timeout", "3s", "--admin-remote", "--tls-client-ca", "ca.pem", "--config", file},
		[]string{"PARTICIPANTD_HEALTH_TLS_CERT=h.pem", "PARTICIPANTD_HEALTH_TLS_KEY=h.key"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s := o.server
	if s.IdleTimeout >= 0 || s.ConnectionRate != 2.5 || s.ConversationRate != 0.5 || s.ConversationBurst != 3 || !s.LimitLoopback || len(s.HealthHosts) != 2 || s.HealthHosts[1] != "b.internal" ||
		s.MaxConnectionsPerAddress != 7 || s.FrameReadTimeout != 3*time.Second || !s.AdminRemote || s.TLSClientCA != "ca.pem" ||
		s.HealthTLSCert != "h.pem" || s.HealthTLSKey != "h.key" ||
		len(s.WSAllowedOrigins) != 2 || s.WSAllowedOrigins[1] != "*.example.com" {
		t.Errorf("exposure settings = %+v", s)
	}
}

// TestParseOptions_AdminTokenAuto: the generated admin token is on by
// default and off with --admin-token-auto=false; the setting is a switch,
// not a secret, so it is logged as is and giving it on the command line
// draws no warning.
func TestParseOptions_AdminTokenAuto(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{{nil, true}, {[]string{"--admin-token-auto=false"}, false}} {
		o, err := parseOptions(tc.args, nil, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if o.server.LocalAdminToken != tc.want {
			t.Errorf("%q: LocalAdminToken = %v, want %v", tc.args, o.server.LocalAdminToken, tc.want)
		}
		if len(o.warnings) != 0 {
			t.Errorf("%q: warnings %q", tc.args, o.warnings)
		}
		for _, e := range o.effective {
			if e.name == "admin-token-auto" && e.value != fmt.Sprint(tc.want) {
				t.Errorf("%q: effective admin-token-auto = %q, want %v", tc.args, e.value, tc.want)
			}
		}
	}
}
