package buildinfo

import (
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestFromBuildInfo_ReadsModuleAndVCS(t *testing.T) {
	bi := &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/participantd/participantd", Version: "v1.2.3"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "abc123def4567890"},
			{Key: "vcs.time", Value: "2026-11-30T18:00:00Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	want := Info{Module: "github.com/participantd/participantd", ModuleVersion: "v1.2.3", Revision: "abc123def4567890",
		Time: "2026-11-30T18:00:00Z", Modified: true, GoVersion: "go1.26.8"}
	if diff := cmp.Diff(want, fromBuildInfo(bi)); diff != "" {
		t.Errorf("fromBuildInfo (-want +got):\n%s", diff)
	}
}

func TestInfo_String_IsOneLineWithVersionCommitAndGo(t *testing.T) {
	i := Info{Version: "v1.2.3", Module: "m", ModuleVersion: "(devel)", Revision: "abc123def4567890",
		Time: "2026-11-30T18:00:00Z", Modified: true, GoVersion: "go1.26.8"}
	want := "participantd v1.2.3 (commit abc123def456, 2026-11-30T18:00:00Z, modified; go1.26.8 " + runtime.GOOS + "/" + runtime.GOARCH + ")\n"
	if got := i.String("participantd"); got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	bare := Info{Version: "v1.2.3", Revision: unknown, Time: unknown, GoVersion: "go1.26.8"}
	if got := bare.String("participantctl"); got != "participantctl v1.2.3 (go1.26.8 "+runtime.GOOS+"/"+runtime.GOARCH+")\n" {
		t.Errorf("String() without VCS = %q", got)
	}
}

func TestFromBuildInfo_WithoutVCS(t *testing.T) {
	got := fromBuildInfo(&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "m", Version: "(devel)"}})
	if got.Revision != "unknown" || got.Time != "unknown" || got.Modified {
		t.Errorf("fromBuildInfo without vcs settings = %+v, want revision and time unknown", got)
	}
}

// The VERSION file is the one source of the version: a tag's name, with
// -dev between releases.
func TestVersion_IsTheVersionFile(t *testing.T) {
	v := Version()
	if !regexp.MustCompile(`^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`).MatchString(v) {
		t.Errorf("VERSION = %q, want vMAJOR.MINOR.PATCH with an optional pre-release suffix", v)
	}
	if strings.Count(versionFile, "\n") > 1 {
		t.Errorf("VERSION file = %q: want one line", versionFile)
	}
	if got := Read(); got.Version != v || got.GoVersion == "" || got.Module == "" {
		t.Errorf("Read() = %+v, want version %s", got, v)
	}
}

func TestRead_RevisionStampReplacesVCS(t *testing.T) {
	old := revision
	defer func() { revision = old }()
	revision = "0123456789abcdef"
	if got := Read(); got.Revision != "0123456789abcdef" {
		t.Errorf("Read().Revision = %q, want the stamp", got.Revision)
	}
}
