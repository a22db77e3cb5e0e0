// Package buildinfo says which build a binary is: the module version and
// the VCS revision the Go toolchain stamped into it (debug.ReadBuildInfo),
// or that the release build stamped in with -ldflags -X, for --version and
// the participantd_build_info metric. It is a leaf.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Info describes one build. Fields the toolchain did not record (a binary
// built with -buildvcs=false, or by go run) are "unknown".
type Info struct {
	// Module is the main module's path; Version its version, "(devel)"
	// for a build from a work tree.
	Module, Version string
	// Revision is the VCS commit, Time its commit time (RFC 3339), and
	// Modified whether the work tree had uncommitted changes.
	Revision, Time string
	Modified       bool
	// GoVersion is the toolchain that built the binary.
	GoVersion string
}

const unknown = "unknown"

// version and revision are stamped by the release build (make release):
//
//	-ldflags "-X github.com/participantd/participantd/internal/buildinfo.version=v0.2.0
//	          -X github.com/participantd/participantd/internal/buildinfo.revision=<commit>"
//
// A build from a work tree records "(devel)" as the module version, and a
// release is built with -buildvcs=false (reproducible, no .git needed): the
// stamps then say what the toolchain could not. Empty means not stamped.
var version, revision string

// Read returns the running binary's build information.
func Read() Info {
	info := Info{Module: unknown, Version: unknown, Revision: unknown, Time: unknown, GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		info = fromBuildInfo(bi)
	}
	return info.stamped(version, revision)
}

// stamped returns i with the release build's stamps, where given, in
// place of what the toolchain recorded.
func (i Info) stamped(version, revision string) Info {
	if version != "" {
		i.Version = version
	}
	if revision != "" {
		i.Revision = revision
	}
	return i
}

func fromBuildInfo(bi *debug.BuildInfo) Info {
	info := Info{Module: unknown, Version: unknown, Revision: unknown, Time: unknown, GoVersion: bi.GoVersion}
	if bi.Main.Path != "" {
		info.Module = bi.Main.Path
	}
	if bi.Main.Version != "" {
		info.Version = bi.Main.Version
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

// String formats the build for --version, after the program's name and
// protocol-level version:
//
//	participantd 0.1.0
//	module github.com/participantd/participantd (devel)
//	revision 1baa5c1d... 2026-11-30T18:00:00Z (modified)
//	go1.26.8
func (i Info) String(program, version string) string {
	rev := i.Revision
	if i.Time != unknown {
		rev += " " + i.Time
	}
	if i.Modified {
		rev += " (modified)"
	}
	return fmt.Sprintf("%s %s\nmodule %s %s\nrevision %s\n%s\n", program, version, i.Module, i.Version, rev, i.GoVersion)
}
