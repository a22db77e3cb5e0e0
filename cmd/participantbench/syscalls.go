package main

import "path/filepath"

// procCounts are the process's system calls and context switches so far,
// from /proc/self (Linux): syscr and syscw count every read-like and
// write-like system call (socket reads and writes, pwrite and the log's
// reads; fdatasync is neither), the switches are summed over the
// process's threads. ok is false where /proc does not have them.
type procCounts struct {
	reads, writes       uint64
	voluntary, involunt uint64
	ok                  bool
}

func readProcCounts() procCounts {
	var c procCounts
	io, err := procFields("/proc/self/io")
	if err != nil {
		return c
	}
	c.reads, c.writes = io["syscr"], io["syscw"]
	tasks, _ := filepath.Glob("/proc/self/task/*/status")
	for _, t := range tasks {
		st, err := procFields(t)
		if err != nil {
			continue // the thread exited
		}
		c.voluntary += st["voluntary_ctxt_switches"]
		c.involunt += st["nonvoluntary_ctxt_switches"]
	}
	c.ok = true
	return c
}

// syscallFigure is the process's system calls and thread context switches
// per counted operation over the measured window, with --embedded (server
// and bench client in one process). A thread that exits within the window
// takes its switches with it, so those are a floor.
type syscallFigure struct {
	ReadsPerOp     float64 `json:"read_syscalls_per_op"`
	WritesPerOp    float64 `json:"write_syscalls_per_op"`
	VoluntaryPerOp float64 `json:"voluntary_switches_per_op"`
	InvoluntPerOp  float64 `json:"involuntary_switches_per_op"`
}

func syscallFigureOf(before, after procCounts, ops uint64) *syscallFigure {
	if !before.ok || !after.ok || ops == 0 {
		return nil
	}
	k := 1 / float64(ops)
	return &syscallFigure{
		ReadsPerOp:     float64(after.reads-before.reads) * k,
		WritesPerOp:    float64(after.writes-before.writes) * k,
		VoluntaryPerOp: float64(after.voluntary-min(before.voluntary, after.voluntary)) * k,
		InvoluntPerOp:  float64(after.involunt-min(before.involunt, after.involunt)) * k,
	}
}
