package server

import "testing"

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
