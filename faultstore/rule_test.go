package faultstore

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRules_FireWhereTheyShouldAndNowhereElse(t *testing.T) {
	appendOutbox := Op{Index: 0, Kind: OpAppend, Name: "outbox/1"}
	appendOplog := Op{Index: 1, Kind: OpAppend, Name: "oplog/1"}
	readOutbox := Op{Index: 2, Kind: OpRead, Name: "outbox/1"}
	casKey := Op{Index: 3, Kind: OpCAS, Name: "server/incarnation"}
	scan := Op{Index: 4, Kind: OpScan, Name: "server/"}
	flushOutbox := Op{Index: 5, Kind: OpFlush, Pending: []string{"oplog/1", "outbox/1"}}
	flushOplog := Op{Index: 6, Kind: OpFlush, Pending: []string{"oplog/1"}}
	flushEmpty := Op{Index: 7, Kind: OpFlush}
	all := []Op{appendOutbox, appendOplog, readOutbox, casKey, scan, flushOutbox, flushOplog, flushEmpty}

	tests := []struct {
		name string
		rule Rule
		// fires lists the indices of the ops in all the rule fires on.
		fires []uint64
	}{
		{"OnIndex", OnIndex(3, Fail), []uint64{3}},
		{"OnIndex past the end", OnIndex(99, Fail), nil},
		{"OnKind append", OnKind(OpAppend, Fail), []uint64{0, 1}},
		{"OnKind read", OnKind(OpRead, Fail), []uint64{2}},
		{"OnKind cas", OnKind(OpCAS, Fail), []uint64{3}},
		{"OnKind scan", OnKind(OpScan, Fail), []uint64{4}},
		{"OnKind flush", OnKind(OpFlush, Fail), []uint64{5, 6, 7}},
		{"OnPrefix matches names and pending flushes", OnPrefix("outbox/", Fail), []uint64{0, 2, 5}},
		{"OnPrefix empty matches named ops and non-empty flushes", OnPrefix("", Fail), []uint64{0, 1, 2, 3, 4, 5, 6}},
		{"Name is exact", When(Fail, Name("outbox/1")), []uint64{0, 2}},
		{"Name never matches a flush", When(Fail, Name("")), nil},
		{"When without predicates matches all", When(Fail), []uint64{0, 1, 2, 3, 4, 5, 6, 7}},
		{"When conjoins its predicates", When(Fail, Kind(OpFlush), Prefix("outbox/")), []uint64{5}},
		{"And", When(Fail, And(Kind(OpAppend), Prefix("oplog/"))), []uint64{1}},
		{"And of nothing is true", When(Fail, And()), []uint64{0, 1, 2, 3, 4, 5, 6, 7}},
		{"Or", When(Fail, Or(Index(0), Kind(OpScan))), []uint64{0, 4}},
		{"Or of nothing is false", When(Fail, Or()), nil},
		{"Not", When(Fail, Not(Kind(OpFlush, OpRead))), []uint64{0, 1, 3, 4}},
		{"Kind of several", When(Fail, Kind(OpCAS, OpScan)), []uint64{3, 4}},
		{"First skips None", First(OnIndex(99, Cut), OnKind(OpScan, Fail)), []uint64{4}},
		{"First of nothing", First(), nil},
		{"RuleFunc", RuleFunc(func(op Op) Action {
			if op.Index%2 == 1 {
				return Fail
			}
			return None
		}), []uint64{1, 3, 5, 7}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var fired []uint64
			for _, op := range all {
				switch a := tt.rule.Decide(op); a {
				case None:
				case Fail:
					fired = append(fired, op.Index)
				default:
					t.Errorf("Decide(%s) = %s, want fail or none", op, a)
				}
			}
			if diff := cmp.Diff(tt.fires, fired); diff != "" {
				t.Errorf("rule fired on %v, want %v (-want +got):\n%s", fired, tt.fires, diff)
			}
		})
	}
}

func TestFirst_FirstActionWins(t *testing.T) {
	r := First(OnKind(OpAppend, Uncertain), OnPrefix("outbox/", Cut), When(Fail))
	for _, tt := range []struct {
		op   Op
		want Action
	}{
		{Op{Kind: OpAppend, Name: "outbox/1"}, Uncertain},
		{Op{Kind: OpRead, Name: "outbox/1"}, Cut},
		{Op{Kind: OpRead, Name: "oplog/1"}, Fail},
	} {
		if got := r.Decide(tt.op); got != tt.want {
			t.Errorf("Decide(%s) = %s, want %s", tt.op, got, tt.want)
		}
	}
}

func TestOnce_FiresOnTheFirstMatchOnly(t *testing.T) {
	r := Once(OnKind(OpFlush, Fail))
	ops := []Op{
		{Index: 0, Kind: OpAppend},
		{Index: 1, Kind: OpFlush},
		{Index: 2, Kind: OpFlush},
	}
	want := []Action{None, Fail, None}
	for i, op := range ops {
		if got := r.Decide(op); got != want[i] {
			t.Errorf("Decide(%s) = %s, want %s", op, got, want[i])
		}
	}
}

func TestSwitch_TogglesAtRuntime(t *testing.T) {
	w := NewSwitch(OnKind(OpAppend, Fail))
	op := Op{Kind: OpAppend, Name: "outbox/1"}
	if w.On() {
		t.Fatalf("NewSwitch().On() = true, want false")
	}
	if got := w.Decide(op); got != None {
		t.Errorf("off: Decide(%s) = %s, want none", op, got)
	}
	w.Set(true)
	if got := w.Decide(op); got != Fail {
		t.Errorf("on: Decide(%s) = %s, want fail", op, got)
	}
	if got := w.Decide(Op{Kind: OpFlush}); got != None {
		t.Errorf("on: Decide(flush) = %s, want none (the wrapped rule does not match)", got)
	}
	w.Set(false)
	if got := w.Decide(op); got != None {
		t.Errorf("off again: Decide(%s) = %s, want none", op, got)
	}
}

func TestStrings(t *testing.T) {
	for _, tt := range []struct {
		got, want string
	}{
		{OpAppend.String(), "append"},
		{OpScan.String(), "scan"},
		{OpKind(0).String(), "OpKind(0)"},
		{Uncertain.String(), "uncertain"},
		{Action(9).String(), "Action(9)"},
		{Op{Index: 3, Kind: OpAppend, Name: "outbox/1"}.String(), `#3 append "outbox/1"`},
		{Op{Index: 4, Kind: OpFlush, Pending: []string{"a", "b"}}.String(), "#4 flush [a b]"},
	} {
		if tt.got != tt.want {
			t.Errorf("String() = %q, want %q", tt.got, tt.want)
		}
	}
}
