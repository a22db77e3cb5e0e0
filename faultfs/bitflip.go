package faultfs

import (
	"fmt"
	"math/rand/v2"
	"os"
)

// Bit flips model bytes changed in place after they were written and
// synced: bit rot, a misdirected write, a controller's bug. No crash
// model produces them (a crash keeps or loses what was written, it does
// not invent), and nothing but a checksum of what was written can tell
// them apart from data: every stored value carries one, checked on read.
//
// A bit-flip run copies a small data directory once per flip, flips one
// byte of one file of the copy, and opens it: each flip must be refused
// (an open error, a verification error, the conversation contained) or
// harmless (every answer the copy serves is byte for byte what was
// acknowledged); a different answer served is the failure.

// FlipBits xors mask into the byte at off of the file at path on the
// operating system's disk, in place, and syncs it.
func FlipBits(path string, off int64, mask byte) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	b := []byte{0}
	if _, err := f.ReadAt(b, off); err != nil {
		f.Close()
		return fmt.Errorf("faultfs: flip %s at %d: %w", path, off, err)
	}
	b[0] ^= mask
	if _, err := f.WriteAt(b, off); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// FlipOffsets returns the offsets of a file of size bytes a bit-flip run
// visits: every stride-th byte (stride 1: every byte) from an offset
// below stride that rng draws, so that runs with different seeds cover
// different bytes.
func FlipOffsets(size, stride int64, rng *rand.Rand) []int64 {
	if stride < 1 {
		stride = 1
	}
	var out []int64
	for off := rng.Int64N(stride); off < size; off += stride {
		out = append(out, off)
	}
	return out
}
