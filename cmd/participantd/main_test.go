package main

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/server"
)

func devNull(t *testing.T) *os.File {
	t.Helper()
	f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestRun_Version(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"--version"}, nil, &out, devNull(t)); code != 0 {
		t.Fatalf("--version = exit %d", code)
	}
	// One line: the program, the version (the same one welcome.server
	// and participantd_build_info announce), and the build.
	want := regexp.MustCompile(`^participantd ` + regexp.QuoteMeta(server.Version) + ` \(.*go1\.[0-9.]+ [a-z0-9]+/[a-z0-9]+\)\n$`)
	if !want.MatchString(out.String()) {
		t.Errorf("--version printed %q, want one line matching %s", out.String(), want)
	}
}

func TestRun_Healthcheck(t *testing.T) {
	status := http.StatusServiceUnavailable
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/ready" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
	}))
	defer hs.Close()
	_, port, _ := net.SplitHostPort(hs.Listener.Addr().String())
	// 0.0.0.0 is how a container listens; the probe dials this machine.
	addr := "0.0.0.0:" + port
	if code := run([]string{"--healthcheck", "--health-listen", addr}, nil, &bytes.Buffer{}, devNull(t)); code != 1 {
		t.Errorf("healthcheck of a 503 /ready = exit %d, want 1", code)
	}
	status = http.StatusOK
	if code := run([]string{"--healthcheck", "--health-listen", addr}, nil, &bytes.Buffer{}, devNull(t)); code != 0 {
		t.Errorf("healthcheck of a 200 /ready = exit %d, want 0", code)
	}
	// The address comes from the environment as for serving.
	if code := run([]string{"--healthcheck"}, []string{"PARTICIPANTD_HEALTH_LISTEN=" + addr}, &bytes.Buffer{}, devNull(t)); code != 0 {
		t.Errorf("healthcheck with PARTICIPANTD_HEALTH_LISTEN = exit %d, want 0", code)
	}
	hs.Close()
	if code := run([]string{"--healthcheck", "--health-listen", addr}, nil, &bytes.Buffer{}, devNull(t)); code != 1 {
		t.Errorf("healthcheck of nothing listening = exit %d, want 1", code)
	}
}

func TestLogConfig_OneLineWithEffectiveSettingsSecretsRedacted(t *testing.T) {
	o, err := parseOptions([]string{"--auth-token", strongToken, "--max-frame", "2048", "--max-record-bytes", "1024"},
		[]string{"PARTICIPANTD_LISTEN=127.0.0.1:9999"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	logConfig(zerolog.New(&buf), o)
	if strings.Contains(buf.String(), strongToken) {
		t.Fatalf("the start-up line shows the auth token: %s", buf.String())
	}
	var line struct {
		Auth       bool              `json:"auth"`
		TLS        bool              `json:"tls"`
		Config     map[string]string `json:"config"`
		ConfigFrom map[string]string `json:"config_from"`
	}
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("not one JSON line: %v: %s", err, buf.String())
	}
	if !line.Auth || line.TLS {
		t.Errorf("auth, tls = %v, %v; want true, false", line.Auth, line.TLS)
	}
	for _, s := range settings {
		if _, ok := line.Config[s.name]; !ok {
			t.Errorf("the start-up line lacks setting %s", s.name)
		}
	}
	for k, want := range map[string]string{"auth-token": "(redacted)", "token-window": "0s", "max-frame": "2048", "listen": "127.0.0.1:9999", "data": "data"} {
		if got := line.Config[k]; got != want {
			t.Errorf("config[%s] = %q, want %q", k, got, want)
		}
	}
	if line.ConfigFrom["listen"] != "PARTICIPANTD_LISTEN" || line.ConfigFrom["max-frame"] != "--max-frame" {
		t.Errorf("config_from = %v, want listen from the environment and max-frame from the flag", line.ConfigFrom)
	}
}

func TestParseOptions_LogFormatAndPprof(t *testing.T) {
	o, err := parseOptions([]string{"--log-format", "console", "--pprof"}, nil, &bytes.Buffer{})
	if err != nil || o.logFormat != "console" || !o.server.Pprof {
		t.Errorf("parseOptions = %q, pprof %v, %v; want console, true", o.logFormat, o.server.Pprof, err)
	}
	if _, err := parseOptions([]string{"--log-format", "xml"}, nil, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "log-format") {
		t.Errorf("--log-format xml = %v, want an error naming log-format", err)
	}
}

func TestRun_BadFlagPrintsTheErrorAndAPointerToHelp(t *testing.T) {
	stderr, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	if code := run([]string{"--no-such-flag"}, nil, &bytes.Buffer{}, stderr); code != 2 {
		t.Errorf("--no-such-flag = exit %d, want 2", code)
	}
	b, err := os.ReadFile(stderr.Name())
	if err != nil {
		t.Fatal(err)
	}
	want := "participantd: flag provided but not defined: -no-such-flag\nparticipantd -h lists every setting.\n"
	if string(b) != want {
		t.Errorf("--no-such-flag printed\n%s\nwant\n%s", b, want)
	}
}

func TestParseOptions_HelpPrintsUsage(t *testing.T) {
	var out bytes.Buffer
	if _, err := parseOptions([]string{"-h"}, nil, &out); err != errHelp {
		t.Fatalf("-h = %v, want errHelp", err)
	}
	if !strings.HasPrefix(out.String(), "Usage: participantd") || !strings.Contains(out.String(), "--log-format") {
		t.Errorf("-h printed %q, want the usage with every setting", out.String())
	}
}

func TestNewLogger_ConsoleIntoAFileHasNoColour(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	log := newLogger(f, zerolog.InfoLevel, "console")
	log.Info().Str("k", "v").Msg("hello")
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "hello") {
		t.Fatalf("console log = %q, want the message", b)
	}
	if strings.Contains(string(b), "\x1b[") {
		t.Errorf("console log into a file holds colour codes: %q", b)
	}
}

// TestHealthcheck_SaysWhyNotReady: the probe's error carries /ready's
// reason, which is what a container's health log then shows.
func TestHealthcheck_SaysWhyNotReady(t *testing.T) {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"ready":false,"reason":"lease lost"}` + "\n"))
	}))
	defer hs.Close()
	err := healthcheck(hs.Listener.Addr().String(), false, 5*time.Second)
	if err == nil || !strings.HasSuffix(err.Error(), ": lease lost") {
		t.Errorf("healthcheck = %v, want an error ending in the reason, lease lost", err)
	}
}
