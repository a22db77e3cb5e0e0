package server

import (
	"os"
	"path/filepath"
	"testing"
)

// TestMachineConversations: the default of --max-conversations is half
// the memory the process may use at about 5 KB a conversation, bounded;
// the memory is the least of the cgroup's limit and the machine's total,
// and an unlimited cgroup leaves the total.
func TestMachineConversations(t *testing.T) {
	for _, tc := range []struct {
		name   string
		files  map[string]string
		memory uint64
		convs  int
	}{
		{"nothing readable", nil, 0, 1_000_000},
		{"meminfo only", map[string]string{"proc/meminfo": "MemTotal:        8000000 kB\nMemFree: 1 kB\n"}, 8000000 << 10, 800_000},
		{"cgroup v2 limit", map[string]string{"proc/meminfo": "MemTotal: 8000000 kB\n", "sys/fs/cgroup/memory.max": "536870912\n"}, 512 << 20, 52_428},
		{"cgroup v2 unlimited", map[string]string{"proc/meminfo": "MemTotal: 2000000 kB\n", "sys/fs/cgroup/memory.max": "max\n"}, 2000000 << 10, 200_000},
		{"cgroup v1 limit", map[string]string{"sys/fs/cgroup/memory/memory.limit_in_bytes": "1073741824\n"}, 1 << 30, 104_857},
		{"cgroup v1 unlimited", map[string]string{"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n"}, 0, 1_000_000},
		{"tiny", map[string]string{"proc/meminfo": "MemTotal: 1000 kB\n"}, 1000 << 10, 1_000},
		{"huge", map[string]string{"proc/meminfo": "MemTotal: 1000000000 kB\n"}, 1000000000 << 10, 1_000_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for name, body := range tc.files {
				p := filepath.Join(root, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			mem := machineMemory(root)
			if mem != tc.memory {
				t.Errorf("machineMemory = %d, want %d", mem, tc.memory)
			}
			if got := conversationsFor(mem); got != tc.convs {
				t.Errorf("conversationsFor(%d) = %d, want %d", mem, got, tc.convs)
			}
		})
	}
}
