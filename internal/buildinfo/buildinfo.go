// Package buildinfo says which build a binary is, for --version, the
// welcome's server string and the participantd_build_info metric. It is a
// leaf.
//
// The version has one source: the VERSION file beside this file, embedded
// at build time. Between releases it names the next release with a -dev
// suffix (v0.2.0-dev); a release commit drops the suffix and is tagged
// with the same name (docs/operations.md, "Releases"), so a binary built
// from any checkout, by go run, go install …@vX.Y.Z or make release, says
// the same version. What the file cannot say, the commit, comes from the
// VCS stamp the toolchain records or, in a release build (-buildvcs=false,
// reproducible), from -ldflags -X …/buildinfo.revision=<commit>.
package buildinfo

import (
	_ "embed"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

//go:embed VERSION
var versionFile string

// Info describes one build. Fields the toolchain did not record (a binary
// built with -buildvcs=false and no stamp) are "unknown".
type Info struct {
	// Version is the VERSION file's: vMAJOR.MINOR.PATCH, with -dev between
	// releases.
	Version string
	// Module is the main module's path and ModuleVersion the version the
	// Go toolchain recorded for it: "(devel)" in a build from a work tree,
	// the tag or a pseudo-version after go install …@version.
	Module, ModuleVersion string
	// Revision is the VCS commit, Time its commit time (RFC 3339), and
	// Modified whether the work tree had uncommitted changes.
	Revision, Time string
	Modified       bool
	// GoVersion is the toolchain that built the binary.
	GoVersion string
}

const unknown = "unknown"

// revision is stamped by the release build, which builds with
// -buildvcs=false so that the binaries do not depend on .git:
//
//	-ldflags "-X github.com/participantd/participantd/internal/buildinfo.revision=<commit>"
//
// Empty means not stamped.
var revision string

// Version returns the build's version, the VERSION file's content.
func Version() string { return strings.TrimSpace(versionFile) }

// Read returns the running binary's build information.
func Read() Info {
	info := Info{Module: unknown, ModuleVersion: unknown, Revision: unknown, Time: unknown, GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		info = fromBuildInfo(bi)
	}
	info.Version = Version()
	if revision != "" {
		info.Revision = revision
	}
	return info
}

func fromBuildInfo(bi *debug.BuildInfo) Info {
	info := Info{Module: unknown, ModuleVersion: unknown, Revision: unknown, Time: unknown, GoVersion: bi.GoVersion}
	if bi.Main.Path != "" {
		info.Module = bi.Main.Path
	}
	if bi.Main.Version != "" {
		info.ModuleVersion = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.time":
			info.Time = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}

// String formats the build as the one line --version prints, after the
// program's name:
//
//	participantd v0.2.0-dev (commit 1baa5c1d2e3f, 2026-11-30T18:00:00Z, modified; go1.26.8 linux/amd64)
//
// The commit is shortened to 12 hex digits; what the toolchain did not
// record is left out.
func (i Info) String(program string) string {
	var build []string
	if i.Revision != unknown {
		rev := i.Revision
		if len(rev) > 12 {
			rev = rev[:12]
		}
		build = append(build, "commit "+rev)
	}
	if i.Time != unknown {
		build = append(build, i.Time)
	}
	if i.Modified {
		build = append(build, "modified")
	}
	detail := i.GoVersion + " " + runtime.GOOS + "/" + runtime.GOARCH
	if len(build) > 0 {
		detail = strings.Join(build, ", ") + "; " + detail
	}
	return fmt.Sprintf("%s %s (%s)\n", program, i.Version, detail)
}
