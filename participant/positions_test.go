package participant

import (
	"math/rand/v2"
	"testing"
)

// TestPositions_MatchAModel adds records in seq order, each in the outbox
// row of the one before, the next, or one further on, drops the oldest
// now and then, and checks every seq's row against a plain slice.
func TestPositions_MatchAModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		var p positions
		var model []uint64 // model[i] is the row of record first+i
		first, next := Seq(1+rng.IntN(10)), Seq(0)
		next = first
		row := uint64(rng.IntN(100))
		for step := range 400 {
			switch r := rng.IntN(10); {
			case r < 7:
				switch rng.IntN(4) {
				case 0: // shares the row of the record before
				case 1:
					row += uint64(2 + rng.IntN(5))
				default:
					row++
				}
				p.add(next, row)
				model = append(model, row)
				next++
			default:
				q := first + Seq(rng.IntN(len(model)+2))
				p.dropBelow(q)
				if n := int(min(uint64(max(q, first)-first), uint64(len(model)))); n > 0 {
					model, first = model[n:], first+Seq(n)
				}
			}
			for q := first - 1; q <= next; q++ {
				got, ok := p.row(q)
				i := int(q) - int(first)
				want, wantOK := uint64(0), i >= 0 && i < len(model)
				if wantOK {
					want = model[i]
				}
				if got != want || ok != wantOK {
					t.Fatalf("round %d step %d: row(%v) = %d, %v, want %d, %v", round, step, q, got, ok, want, wantOK)
				}
			}
		}
	}
}

// TestPositions_AStreamOfTellsHoldsOneSpan adds the records of 65,536
// tells, one an outbox row, and checks that they cost one allocation: a
// deaf recipient's backlog, which a checkpoint derivation holds the
// positions of, is one span. Before, positions held 8 bytes a record in
// an array grown by doubling (17 allocations, 1 MiB at the end).
func TestPositions_AStreamOfTellsHoldsOneSpan(t *testing.T) {
	allocs := testing.AllocsPerRun(10, func() {
		var p positions
		for i := range 1 << 16 {
			p.add(Seq(3+i), uint64(7+i))
		}
		p.dropBelow(1000)
		if row, ok := p.row(1 << 15); !ok || row != 1<<15+4 {
			t.Fatalf("row(%d) = %d, %v, want %d, true", 1<<15, row, ok, 1<<15+4)
		}
	})
	if allocs > 1 {
		t.Errorf("the positions of 65,536 tells took %.0f allocations, want 1", allocs)
	}
}
