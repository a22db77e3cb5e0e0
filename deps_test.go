package participantd_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependenciesPointOneWay keeps docs/DESIGN.md's layering: the leaves import
// nothing of the project, the storage layers only what is below them, and
// nothing imports the binaries.
func TestDependenciesPointOneWay(t *testing.T) {
	const mod = "github.com/participantd/participantd/"
	allowed := map[string][]string{
		"wire":            {},
		"fence":           {},
		"store":           {},
		"faultstore":      {"store"},
		"store/etcdstore": {"store"},
		"cluster":         {"store", "oplog", "outbox", "participant"},
		"cluster/backup":  {"cluster", "store"},
		"oplog":           {},
		"outbox":          {"oplog"},
		"participant":     {"store", "oplog", "outbox", "fence", "participant/internal"},
		"client":          {"wire"},
		"store/vfs":       {},
		"store/wal":       {"store/vfs"},
		"store/logfirst":  {"store"},
		"faultfs":         {"store/vfs"},
		"offline":         {"participant", "store"},
		"server":          {"wire", "participant", "oplog", "store", "cluster", "internal"},
	}
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], mod)
		for _, imp := range fields[1:] {
			if strings.HasPrefix(imp, mod+"cmd/") {
				t.Errorf("%s imports %s: cmd/ holds only mains, nothing imports them", pkg, strings.TrimPrefix(imp, mod))
			}
		}
		allow, checked := allowed[pkg]
		if !checked {
			continue
		}
		for _, imp := range fields[1:] {
			if !strings.HasPrefix(imp, mod) {
				continue
			}
			dep := strings.TrimPrefix(imp, mod)
			ok := false
			for _, a := range allow {
				ok = ok || dep == a || strings.HasPrefix(dep, a+"/")
			}
			if !ok {
				t.Errorf("%s imports %s; docs/DESIGN.md allows it only %v", pkg, dep, allow)
			}
		}
	}
}
