package server

import (
	"bufio"
	"bytes"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"

	"github.com/participantd/participantd/participant"
)

// ConversationMemory is about what a loaded conversation costs in memory
// (docs/operations.md, Limits; BENCHMARKS.md): the unit MaxConversations'
// default is sized in.
const ConversationMemory = 5 << 10

// Bounds of the machine-sized MaxConversations default.
const (
	minMachineConversations = 1_000
	maxMachineConversations = participant.DefaultMaxConversations
)

// MachineConversations is the default of MaxConversations: half of the
// memory the process may use (machineMemory) at ConversationMemory bytes
// a conversation, between 1,000 and participant.DefaultMaxConversations;
// the upper bound when the memory cannot be read.
func MachineConversations() int { return conversationsFor(machineMemory("/")) }

// conversationsFor is MachineConversations for mem bytes (0: unknown).
func conversationsFor(mem uint64) int {
	if mem == 0 {
		return maxMachineConversations
	}
	n := mem / 2 / ConversationMemory
	return int(min(max(n, minMachineConversations), maxMachineConversations))
}

// machineMemory returns the memory this process may use, read under root
// (the file system's root, a test's directory): the least of the memory
// cgroup's limit (v2 memory.max, v1 memory.limit_in_bytes), the machine's
// MemTotal (/proc/meminfo) and the Go memory limit (GOMEMLIMIT); 0 when
// none is known.
func machineMemory(root string) uint64 {
	var mem uint64 = math.MaxUint64
	take := func(v uint64) {
		if v > 0 {
			mem = min(mem, v)
		}
	}
	for _, f := range []string{"sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		if b, err := os.ReadFile(filepath.Join(root, f)); err == nil {
			// "max" (v2) or a huge number (v1) mean no limit: the
			// machine's total bounds it then.
			if v, err := strconv.ParseUint(string(bytes.TrimSpace(b)), 10, 64); err == nil && v < 1<<60 {
				take(v)
			}
		}
	}
	take(memTotal(filepath.Join(root, "proc/meminfo")))
	if root == "/" {
		if l := debug.SetMemoryLimit(-1); l > 0 && l < math.MaxInt64 {
			take(uint64(l))
		}
	}
	if mem == math.MaxUint64 {
		return 0
	}
	return mem
}

// memTotal returns MemTotal from the meminfo file at path, 0 if unread.
func memTotal(path string) uint64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := bytes.Fields(sc.Bytes())
		if len(fields) >= 2 && string(fields[0]) == "MemTotal:" {
			kb, err := strconv.ParseUint(string(fields[1]), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}
