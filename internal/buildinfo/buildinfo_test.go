package buildinfo

import (
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
			{Key: "vcs.revision", Value: "abc123"},
			{Key: "vcs.time", Value: "2026-11-30T18:00:00Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	want := Info{Module: "github.com/participantd/participantd", Version: "v1.2.3", Revision: "abc123",
		Time: "2026-11-30T18:00:00Z", Modified: true, GoVersion: "go1.26.8"}
	if diff := cmp.Diff(want, fromBuildInfo(bi)); diff != "" {
		t.Errorf("fromBuildInfo (-want +got):\n%s", diff)
	}
	got := want.String("participantd", "0.1.0")
	for _, s := range []string{"participantd 0.1.0\n", "module github.com/participantd/participantd v1.2.3\n",
		"revision abc123 2026-11-30T18:00:00Z (modified)\n", "go1.26.8\n"} {
		if !strings.Contains(got, s) {
			t.Errorf("String() = %q, want it to contain %q", got, s)
		}
	}
}

func TestFromBuildInfo_WithoutVCS(t *testing.T) {
	got := fromBuildInfo(&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "m", Version: "(devel)"}})
	if got.Revision != "unknown" || got.Time != "unknown" || got.Modified {
		t.Errorf("fromBuildInfo without vcs settings = %+v, want revision and time unknown", got)
	}
}

func TestRead_InATestBinary(t *testing.T) {
	if got := Read(); got.GoVersion == "" || got.Module == "" {
		t.Errorf("Read() = %+v", got)
	}
}

func TestStamped_ReleaseVersionReplacesDevel(t *testing.T) {
	devel := Info{Module: "m", Version: "(devel)", Revision: unknown, Time: unknown, GoVersion: "go1.26.8"}
	got := devel.stamped("v0.2.0", "abc123")
	if got.Version != "v0.2.0" || got.Revision != "abc123" {
		t.Errorf("stamped = %+v, want version v0.2.0 and revision abc123", got)
	}
	if got := devel.stamped("", ""); got != devel {
		t.Errorf("stamped with nothing = %+v, want %+v unchanged", got, devel)
	}
}
