package etcdstore

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkStageAndPack measures what the store does in memory for one
// commit of a typical cluster batch over one conversation's scope, without
// etcd: eight operations, each a token index value CAS'd and two oplog
// rows and one outbox row (256 B) appended, 32 writes in all; then the
// commit taken, packed into transactions, and its success applied. "whole"
// packs the scope into one transaction (etcd's default limits); "cut"
// lowers MaxTxnOps so that the scope is cut along the order of its writes
// over several.
func BenchmarkStageAndPack(b *testing.B) {
	for _, tc := range []struct {
		name      string
		maxTxnOps int
	}{{"whole", 0}, {"cut", 4}} {
		b.Run(tc.name, func(b *testing.B) {
			s := open(nil, nil, Options{
				Scope: func(name string) string {
					sc, _, _ := strings.Cut(name, "/")
					return sc
				},
				MaxTxnOps: tc.maxTxnOps,
			})
			defer s.Close()
			s.mu.Lock()
			c := s.scopeLocked("c1")
			// Loaded under its claim, as a node's conversation is: its
			// commits compare the fence alone.
			c.loaded, c.exact = true, true
			c.claim, c.fenced, c.fenceMod = Fence{Key: "own/c1", CreateRevision: 1}, true, 1
			c.streams["c1/oplog"], c.streams["c1/outbox"] = &stream{firstKnown: true}, &stream{firstKnown: true}
			s.mu.Unlock()
			payload := make([]byte, 256)
			tokens := make([]string, 8)
			for i := range tokens {
				tokens[i] = fmt.Sprintf("c1/tok/%d", i)
			}
			var oplog, outbox uint64
			b.ReportAllocs()
			for i := range b.N {
				for _, tok := range tokens {
					// A value the scope read (ReadValue) before its CAS.
					s.mu.Lock()
					c.reads[tok] = uint64(i)
					s.mu.Unlock()
					if err := s.CAS(tok, uint64(i), uint64(i+1)); err != nil {
						b.Fatal(err)
					}
					for range 2 {
						if _, err := s.Append("c1/oplog", payload, oplog); err != nil {
							b.Fatal(err)
						}
						oplog++
					}
					if _, err := s.Append("c1/outbox", payload, outbox); err != nil {
						b.Fatal(err)
					}
					outbox++
				}
				s.mu.Lock()
				c.wanted = true
				work := s.takeLocked()
				s.mu.Unlock()
				plans := s.pack(work)
				if len(work) != 1 || work[0].err != nil || (tc.maxTxnOps == 0) != (len(plans) == 1) {
					b.Fatalf("took %d scopes into %d transactions", len(work), len(plans))
				}
				// As runTxn records a transaction that committed.
				for _, p := range plans {
					for _, it := range p.items {
						switch {
						case it.vw != nil:
							it.vw.done = true
						case it.swk != nil:
							it.swk.done += it.n
						}
					}
				}
				s.mu.Lock()
				s.applyLocked(work)
				s.mu.Unlock()
			}
		})
	}
}

// BenchmarkFreshScope measures a scope's state before its first write
// (B/op, allocs/op): what the store holds at least for every
// conversation a node serves.
func BenchmarkFreshScope(b *testing.B) {
	b.ReportAllocs()
	for range b.N {
		c := &scope{name: "c1"}
		c.clearLocked()
		sinkScope = c
	}
}

var sinkScope *scope
