package server

import (
	"net"
	"testing"
	"time"

	"github.com/participantd/participantd/wire"
)

func TestTake_WaitsForRoomAndTakesAllOrNothing(t *testing.T) {
	own, shared := newBudget(100), newBudget(150)
	if !take(100, nil, nil, own, shared) {
		t.Fatal("take(100) of empty budgets = false")
	}
	// own is full: a second take waits, holding nothing of shared.
	got := make(chan bool)
	go func() { got <- take(40, nil, nil, own, shared) }()
	select {
	case <-got:
		t.Fatal("take(40) returned while own was full")
	default:
	}
	if u := shared.inUse(); u != 100 && u != 140 {
		t.Fatalf("shared.inUse() = %d while waiting, want 100 (or 140 in passing)", u)
	}
	own.give(100)
	shared.give(100)
	if !<-got {
		t.Fatal("take(40) = false after room was given back")
	}
	if own.inUse() != 40 || shared.inUse() != 40 {
		t.Errorf("inUse = %d, %d, want 40, 40", own.inUse(), shared.inUse())
	}
}

func TestTake_GivesUpWhenStopped(t *testing.T) {
	b := newBudget(10)
	take(10, nil, nil, b)
	stop, quit := make(chan struct{}), make(chan struct{})
	got := make(chan bool)
	go func() { got <- take(5, stop, nil, b) }()
	close(stop)
	if <-got {
		t.Error("take after stop = true, want false")
	}
	go func() { got <- take(5, nil, quit, b) }()
	close(quit)
	if <-got {
		t.Error("take after quit = true, want false")
	}
	if b.inUse() != 10 {
		t.Errorf("inUse = %d, want 10: a stopped take holds nothing", b.inUse())
	}
}

// fakeCut is a holding a test can watch being cut.
type fakeCut struct {
	n   int64
	got bool
}

func (f *fakeCut) cut()        { f.got = true }
func (f *fakeCut) size() int64 { return f.n }

// A principal holds at most its share; above the high water only holders
// that hold little take; a full budget cuts the largest holder's cuttable
// holdings for one that holds less, and never for the largest itself.
func TestSharedBudget_SharesHighWaterAndCuts(t *testing.T) {
	b := newSharedBudget(1000, 30, 10) // share 300, small 50, high water 800
	a, c, d := b.join("a"), b.join("c"), b.join("d")
	if ok, _ := a.tryTake(300); !ok {
		t.Fatal("a took its share: refused")
	}
	if ok, _ := a.tryTake(1); ok {
		t.Fatal("a took past its share")
	}
	if ok, _ := c.tryTake(300); !ok {
		t.Fatal("c took its share: refused")
	}
	if ok, _ := d.tryTake(200); !ok {
		t.Fatal("d took 200 below the high water: refused")
	}
	// 800 used: d holds more than small, so it waits; a fresh holder does not.
	if ok, _ := d.tryTake(10); ok {
		t.Fatal("d, holding 200, took above the high water")
	}
	e, f := b.join("e"), b.join("f")
	if ok, _ := e.tryTake(50); !ok {
		t.Fatal("e, holding nothing, took 50 above the high water: refused")
	}
	for range 3 {
		g := b.join("")
		if ok, _ := g.tryTake(50); !ok {
			t.Fatal("a connection's own holder took 50 above the high water: refused")
		}
	}
	if b.inUse() != 1000 {
		t.Fatalf("inUse = %d, want 1000", b.inUse())
	}
	// Full: f (holding nothing) cuts a largest holder's cuttable holding.
	ac, cc := &fakeCut{n: 100}, &fakeCut{n: 100}
	a.mayCut(ac)
	c.mayCut(cc)
	if ok, _ := f.tryTake(40); ok {
		t.Fatal("f took from a full budget")
	}
	if !ac.got && !cc.got {
		t.Fatal("a full budget cut nobody for a holder that holds nothing")
	}
	if ac.got && cc.got {
		t.Error("both were cut for 40 bytes, want one")
	}
	// A second try, before the cut holding is given back, cuts nothing more.
	if ok, _ := f.tryTake(40); ok || ac.got && cc.got {
		t.Error("a retry cut again what was already on its way back")
	}
	// The largest holder itself waits and cuts nobody.
	a.unmayCut(ac)
	c.unmayCut(cc)
	dc := &fakeCut{n: 100}
	d.mayCut(dc)
	if ok, _ := a.tryTake(1); ok || dc.got {
		t.Errorf("the largest holder: took %v, cut a smaller one %v; want neither", ok, dc.got)
	}
}

// BenchmarkTakeGive is the pending and outbound budgets' cost per frame:
// a connection's budget and the server's, taken and given back by many
// connections at once, with the server's a plain budget (as before
// shares) or shared out (a holder per connection, as for loopback, or
// one principal's for all).
func BenchmarkTakeGive(b *testing.B) {
	b.Run("plain", func(b *testing.B) {
		shared := newBudget(64 << 20)
		b.RunParallel(func(pb *testing.PB) {
			own := newBudget(4 << 20)
			for pb.Next() {
				take(200, nil, nil, own, shared)
				own.give(200)
				shared.give(200)
			}
		})
	})
	for _, name := range []string{"", "one principal"} {
		b.Run("shared/"+name, func(b *testing.B) {
			shared := newSharedBudget(64<<20, 10, 1<<20)
			b.RunParallel(func(pb *testing.PB) {
				own, h := newBudget(4<<20), shared.join(name)
				defer h.leave()
				for pb.Next() {
					take(200, nil, nil, own, h)
					own.give(200)
					h.give(200)
				}
			})
		})
	}
}

// A peer that reads nothing holds its outbound queue's bytes; when the
// server's outbound budget is full, a connection of another holder that
// needs room closes it (the largest holder) instead of waiting for its
// write progress timeout, and takes the room its writer gives back.
func TestSharedBudget_FullOutboundCutsTheDeafQueue(t *testing.T) {
	const frame = 1 << 10
	shared := newSharedBudget(4*frame, 50, frame)
	deaf, peer := net.Pipe() // nobody reads peer: every write blocks
	defer peer.Close()
	quit := make(chan struct{})
	defer close(quit)
	q := newOutq(deaf, time.Hour, newBudget(4*frame), shared.join("deaf"), quit)
	msg := &wire.Pong{ID: 1}
	for shared.inUse() < 2*frame-int64(len(wire.AppendFrame(nil, msg))) {
		if !q.send(msg) {
			t.Fatal("send to the deaf queue failed before its share was full")
		}
	}
	// Two holders take what is left but a half frame...
	for _, name := range []string{"x", "y"} {
		if ok, _ := shared.join(name).tryTake(frame - 16); !ok {
			t.Fatalf("%s could not take a frame", name)
		}
	}
	// ...and a third needs a frame more: the deaf queue, the largest
	// holder, is cut for it.
	if !take(frame/2, nil, nil, shared.join("z")) {
		t.Fatal("a take past a full budget gave up")
	}
	<-q.done
	if !q.shed.Load() {
		t.Error("the deaf queue's connection ended, but not as shed")
	}
}
