package participantd_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestDockerfile_ProductionShape pins what the image promises: a
// multi-stage build of static binaries, a non-root user, the data volume
// and a health check on /ready that needs no HTTP client. deploy/
// check-dockerfile (run by .ci/run) executes the build stage.
func TestDockerfile_ProductionShape(t *testing.T) {
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	for _, c := range []struct{ what, re string }{
		{"a build stage on the go.mod toolchain", `(?m)^FROM golang:1\.26\.8 AS build$`},
		{"a second stage", `(?m)^FROM \S+:nonroot$`},
		{"static binaries", `CGO_ENABLED=0 go build [^\n]*\./cmd/participantd`},
		{"participantctl too", `CGO_ENABLED=0 go build [^\n]*\./cmd/participantctl`},
		{"a non-root user", `(?m)^USER 65532:65532$`},
		{"the data volume", `(?m)^VOLUME \["/data"\]$`},
		{"data in the volume", `PARTICIPANTD_DATA=/data`},
		{"listening beyond loopback", `PARTICIPANTD_LISTEN=0\.0\.0\.0:7420`},
		{"a health check on /ready without curl", `(?s)HEALTHCHECK .*CMD \["/usr/local/bin/participantd", "--healthcheck"\]`},
		{"the volume's mount point owned by the user", `COPY --from=build --chown=65532:65532 /out/data /data`},
	} {
		if !regexp.MustCompile(c.re).MatchString(df) {
			t.Errorf("Dockerfile lacks %s (%s)", c.what, c.re)
		}
	}
	gomod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(gomod)
	if m == nil || !strings.Contains(df, "FROM golang:"+string(m[1])+" ") {
		t.Errorf("the Dockerfile's build image does not match go.mod's go %s", m[1])
	}
}

// TestSystemdUnit_Hardened pins the unit's hardening; .ci/run lints it with
// systemd-analyze verify.
func TestSystemdUnit_Hardened(t *testing.T) {
	b, err := os.ReadFile("deploy/participantd.service")
	if err != nil {
		t.Fatal(err)
	}
	unit := string(b)
	for _, line := range []string{
		"ExecStart=/usr/local/bin/participantd", "KillSignal=SIGTERM", "DynamicUser=yes",
		"StateDirectory=participantd", "Environment=PARTICIPANTD_DATA=/var/lib/participantd",
		"NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
		"PrivateDevices=yes", "CapabilityBoundingSet=", "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
		"SystemCallFilter=@system-service", "MemoryDenyWriteExecute=yes",
	} {
		if !strings.Contains(unit, "\n"+line+"\n") {
			t.Errorf("deploy/participantd.service lacks %q", line)
		}
	}
}

// TestDockerignore_KeepsSecretsAndBuildsOut pins the build context's
// exclusions (issue 27): history, local data directories (stores hold
// tokens, node.key the node's secret), build outputs, other clients'
// dependencies.
func TestDockerignore_KeepsSecretsAndBuildsOut(t *testing.T) {
	b, err := os.ReadFile(".dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	lines := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		lines[strings.TrimSpace(l)] = true
	}
	for _, want := range []string{".git", "data/", "cluster-data/", "bin/", "dist/", "*.db", "*.test", "node_modules/", "**/node_modules/"} {
		if !lines[want] {
			t.Errorf(".dockerignore lacks %q", want)
		}
	}
}

// TestDockerfile_NoOpenAdmission: the image does not opt into open
// admission; cmd/participantd's TestDockerImage_RefusesOpenAdmission runs
// the daemon with the image's environment.
func TestDockerfile_NoOpenAdmission(t *testing.T) {
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if regexp.MustCompile(`(?m)^[^#]*ALLOW_OPEN_ADMISSION`).Match(b) {
		t.Error("the Dockerfile opts into open admission")
	}
}
