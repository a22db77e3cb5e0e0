package participantd_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestDependenciesPointOneWay keeps docs/DESIGN.md's layering: the leaves import
// nothing of the project, the storage layers only what is below them, and
// nothing imports the binaries. Each package lists exactly the packages of
// the project it may import: allowing store does not allow store/logfirst.
// A package that is not listed fails too, so a new one states its place;
// only the mains under cmd/ are free, since nothing imports them.
func TestDependenciesPointOneWay(t *testing.T) {
	const mod = "github.com/participantd/participantd/"
	allowed := map[string][]string{
		"":                            {},
		"wire":                        {},
		"wire/wsframe":                {},
		"fence":                       {},
		"store":                       {},
		"store/boltfmt":               {"store"},
		"store/boltstore":             {"store", "store/boltfmt", "store/internal/stage"},
		"store/internal/stage":        {"store"},
		"store/vfs":                   {},
		"store/wal":                   {"store/vfs"},
		"store/logfirst":              {"store", "store/boltfmt", "store/internal/stage", "store/vfs", "store/wal"},
		"store/logfirst/logfirsttest": {"store/logfirst"},
		"store/etcdstore":             {"store"},
		"store/etcdstore/etcdtest":    {"store/etcdstore", "internal/freeport"},
		"store/storetest":             {"store"},
		"faultstore":                  {"store"},
		"faultfs":                     {"store/vfs"},
		"oplog":                       {"internal/versioned"},
		"outbox":                      {"oplog", "internal/versioned"},
		"registry":                    {"oplog"},
		"checkpoint":                  {"oplog", "outbox"},
		"receipt":                     {"oplog"},
		"tokenindex":                  {"oplog"},
		"participant":                 {"store", "oplog", "outbox", "checkpoint", "receipt", "registry", "tokenindex", "fence", "participant/internal/peek"},
		"participant/internal/peek":   {"oplog", "outbox"},
		"participant/participanttest": {"participant", "participant/internal/peek", "faultstore", "store", "oplog", "outbox", "checkpoint", "tokenindex"},
		"cluster":                     {"store", "store/etcdstore", "oplog", "outbox", "checkpoint", "receipt", "registry", "tokenindex", "participant"},
		"cluster/backup":              {"cluster", "store/etcdstore"},
		"offline":                     {"participant", "store", "store/boltstore", "store/logfirst", "store/vfs"},
		"client":                      {"wire"},
		"server":                      {"wire", "participant", "oplog", "store", "store/boltstore", "store/logfirst", "store/vfs", "cluster", "cluster/backup", "internal/buildinfo"},
		"server/servertest":           {"server"},
		"internal/buildinfo":          {},
		"internal/cli":                {},
		"internal/daemontest":         {"internal/healthwait", "internal/freeport"},
		"internal/freeport":           {},
		"internal/healthwait":         {},
		"internal/heapgoal":           {},
		"internal/golden":             {},
		"internal/versioned":          {},
		"robustness":                  {},
		"deploy":                      {},
		"deploy/kubernetes":           {},
		"scripts":                     {},
	}
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(strings.TrimPrefix(fields[0], mod), strings.TrimSuffix(mod, "/"))
		for _, imp := range fields[1:] {
			if strings.HasPrefix(imp, mod+"cmd/") {
				t.Errorf("%s imports %s: cmd/ holds only mains, nothing imports them", pkg, strings.TrimPrefix(imp, mod))
			}
		}
		if strings.HasPrefix(pkg, "cmd/") {
			continue
		}
		allow, listed := allowed[pkg]
		if !listed {
			t.Errorf("package %q is not listed in TestDependenciesPointOneWay: list the project packages it may import", pkg)
			continue
		}
		for _, imp := range fields[1:] {
			if !strings.HasPrefix(imp, mod) {
				continue
			}
			if dep := strings.TrimPrefix(imp, mod); !slices.Contains(allow, dep) {
				t.Errorf("%s imports %s; docs/DESIGN.md allows it only %v", pkg, dep, allow)
			}
		}
	}
}
