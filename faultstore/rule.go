package faultstore

import (
	"strings"
	"sync/atomic"
)

// Rule decides, per op, which fault (if any) to inject.
//
// A Store consults its rules in op order while holding its sequencing lock,
// so that the cut point and the op indices agree even under concurrent
// calls. A Rule must therefore be quick, must not block, and must not call
// the Store it is installed on. It may be consulted from many goroutines,
// one at a time per Store.
type Rule interface {
	// Decide returns the action for op; None lets it through.
	Decide(op Op) Action
}

// RuleFunc adapts a function to a Rule.
type RuleFunc func(op Op) Action

// Decide calls f(op).
func (f RuleFunc) Decide(op Op) Action { return f(op) }

// Predicate selects ops. Predicates are pure functions of the op.
type Predicate func(op Op) bool

// Kind matches ops of any of the given kinds.
func Kind(kinds ...OpKind) Predicate {
	return func(op Op) bool {
		for _, k := range kinds {
			if op.Kind == k {
				return true
			}
		}
		return false
	}
}

// Prefix matches an op whose Name starts with prefix and, for a Flush,
// which has no name, a flush with a Pending stream that starts with prefix:
// Prefix("outbox/") is "touches an outbox", whether by appending to one or
// by flushing one.
func Prefix(prefix string) Predicate {
	return func(op Op) bool {
		if op.Kind == OpFlush {
			for _, s := range op.Pending {
				if strings.HasPrefix(s, prefix) {
					return true
				}
			}
			return false
		}
		return strings.HasPrefix(op.Name, prefix)
	}
}

// Name matches an op whose Name is exactly name. It never matches a Flush.
func Name(name string) Predicate {
	return func(op Op) bool { return op.Kind != OpFlush && op.Name == name }
}

// Index matches the op with index i.
func Index(i uint64) Predicate {
	return func(op Op) bool { return op.Index == i }
}

// And matches when every predicate matches; And() matches every op.
func And(preds ...Predicate) Predicate {
	return func(op Op) bool {
		for _, p := range preds {
			if !p(op) {
				return false
			}
		}
		return true
	}
}

// Or matches when any predicate matches; Or() matches no op.
func Or(preds ...Predicate) Predicate {
	return func(op Op) bool {
		for _, p := range preds {
			if p(op) {
				return true
			}
		}
		return false
	}
}

// Not matches when p does not.
func Not(p Predicate) Predicate {
	return func(op Op) bool { return !p(op) }
}

// When returns a rule that answers action for an op every predicate
// matches, and None otherwise. With no predicates it matches every op.
func When(action Action, preds ...Predicate) Rule {
	match := And(preds...)
	return RuleFunc(func(op Op) Action {
		if match(op) {
			return action
		}
		return None
	})
}

// OnIndex returns a rule that answers action for the op with index i.
func OnIndex(i uint64, action Action) Rule { return When(action, Index(i)) }

// OnKind returns a rule that answers action for every op of kind.
func OnKind(kind OpKind, action Action) Rule { return When(action, Kind(kind)) }

// OnPrefix returns a rule that answers action for every op Prefix(prefix)
// matches: appends, reads, CASes and scans by name, flushes by Pending.
func OnPrefix(prefix string, action Action) Rule { return When(action, Prefix(prefix)) }

// First returns a rule that answers the first action other than None among
// rules, in order. A Store treats its own rule list the same way.
func First(rules ...Rule) Rule {
	return RuleFunc(func(op Op) Action {
		for _, r := range rules {
			if a := r.Decide(op); a != None {
				return a
			}
		}
		return None
	})
}

// Once returns a rule that answers rule's first action other than None,
// and None for every op after that one.
func Once(rule Rule) Rule {
	var fired atomic.Bool
	return RuleFunc(func(op Op) Action {
		if fired.Load() {
			return None
		}
		a := rule.Decide(op)
		if a == None || !fired.CompareAndSwap(false, true) {
			return None
		}
		return a
	})
}

// Switch is a rule that can be turned on and off at runtime, from any
// goroutine: while off it answers None, while on it answers what its rule
// answers. A new Switch is off.
type Switch struct {
	rule Rule
	on   atomic.Bool
}

// NewSwitch returns a Switch around rule, turned off.
func NewSwitch(rule Rule) *Switch { return &Switch{rule: rule} }

// Set turns the switch on or off. Ops admitted after Set returns see the
// new state.
func (w *Switch) Set(on bool) { w.on.Store(on) }

// On reports whether the switch is on.
func (w *Switch) On() bool { return w.on.Load() }

// Decide implements Rule.
func (w *Switch) Decide(op Op) Action {
	if !w.on.Load() {
		return None
	}
	return w.rule.Decide(op)
}
