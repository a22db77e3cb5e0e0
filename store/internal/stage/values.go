package stage

import (
	"sort"
	"strings"
	"sync"

	"github.com/participantd/participantd/store"
)

// Values is an engine's in-memory layer of uint64 values, between its
// callers and its durable state (the file its reads load from): every
// write that has not landed there yet, which reads see first, and a cache
// of values loaded from there, so that a token lookup and the CAS that
// follows it load the file once.
//
// A write is staged (StageLocked), taken by a commit (TakeStagedLocked),
// and lands when the durable state the engine reads holds it (LandLocked):
// for boltstore when its commit's transaction is durable, for logfirst
// when a checkpoint applied its log record to bbolt. A value loaded
// without the engine's mutex held is trusted, and cached, only if no
// landing happened since the load began (Epoch), since one may have
// replaced the value loaded.
//
// Its fields are guarded by the engine's mutex; every method is called
// with it held.
type Values struct {
	// writes holds the latest write of every key not landed: staged,
	// being committed, or committed and not yet in the durable state.
	// A key absent from it has its current value in the durable state.
	writes map[string]Write
	// staged holds the writes not yet taken by a commit.
	staged map[string]Write
	// reads caches values loaded from the durable state of keys absent
	// from writes, bounded as Forget says.
	reads  map[string]uint64
	forget Forget
	// epoch advances at every landing; gen numbers writes, so that a
	// landing forgets a key only if no later write of it is in memory.
	epoch uint64
	gen   uint64
}

// Write is one value write. Its generation orders it among the writes of
// its key.
type Write struct {
	Value uint64
	gen   uint64
}

// Forget is how an engine bounds the reads it caches. Both bounds hold
// MaxCachedValues keys at the most; they differ in how often writes land.
type Forget int

const (
	// ForgetAtLanding forgets every cached read when writes land, and
	// caches no more while full: for an engine whose writes land at every
	// commit (boltstore), so the cache holds what was read between two.
	ForgetAtLanding Forget = iota
	// ForgetLanded forgets the cached reads of the keys that landed only,
	// and empties the cache when it is full: for an engine whose writes
	// land seldom (logfirst's checkpoints), where reads of keys nobody
	// writes stay good.
	ForgetLanded
)

// MaxCachedValues bounds the values a Values caches from the durable
// state.
const MaxCachedValues = 1 << 16

// NewValues returns an empty layer that bounds its cache as forget says.
func NewValues(forget Forget) *Values {
	return &Values{
		writes: make(map[string]Write),
		staged: make(map[string]Write),
		reads:  make(map[string]uint64),
		forget: forget,
	}
}

// GetLocked returns the current value of key when this layer knows it: its
// latest write, or its cached read. ok is false when the caller must load
// it from the durable state (see Epoch and CacheLocked).
func (vs *Values) GetLocked(key string) (v uint64, ok bool) {
	if w, ok := vs.writes[key]; ok {
		return w.Value, true
	}
	v, ok = vs.reads[key]
	return v, ok
}

// EpochLocked returns the landing epoch, for a load about to run without
// the mutex: CacheLocked takes it back.
func (vs *Values) EpochLocked() uint64 { return vs.epoch }

// CacheLocked records v, loaded from the durable state since epoch, as
// key's value, and reports whether it still is: no write of key was made
// meanwhile and nothing landed (a landing may have replaced v). When it
// is, v is cached if the bound allows. After ReleaseLocked it reports
// false.
func (vs *Values) CacheLocked(key string, v uint64, epoch uint64) bool {
	if vs.writes == nil {
		return false
	}
	if _, ok := vs.writes[key]; ok || vs.epoch != epoch {
		return false
	}
	if len(vs.reads) >= MaxCachedValues {
		if vs.forget == ForgetAtLanding {
			return true
		}
		clear(vs.reads)
	}
	vs.reads[key] = v
	return true
}

// Current returns key's current value, for a CAS to compare: from the
// layer, or loaded from the durable state with load while mu, the engine's
// mutex, is released, and loaded again if writes landed meanwhile (the
// value loaded may be stale then). usable is the engine's check that it
// may still serve (sticky error, Close); it runs, with mu held, before
// every look and after every load. Current is called with mu held and
// returns with mu held, as sync.Cond.Wait does; load's error is returned
// as is.
func (vs *Values) Current(mu sync.Locker, key string, usable func() error, load func(key string) (uint64, error)) (uint64, error) {
	for {
		v, current, err := vs.look(mu, key, usable, load)
		if err != nil || current {
			return v, err
		}
	}
}

// Read is Current for a read: a value loaded while writes landed is
// returned, not loaded again and not cached, since a read concurrent with
// a write may see either value.
func (vs *Values) Read(mu sync.Locker, key string, usable func() error, load func(key string) (uint64, error)) (uint64, error) {
	v, _, err := vs.look(mu, key, usable, load)
	return v, err
}

// look is one look of Current: it reports whether v is key's current
// value, which it then caches when loaded.
func (vs *Values) look(mu sync.Locker, key string, usable func() error, load func(key string) (uint64, error)) (v uint64, current bool, err error) {
	if err := usable(); err != nil {
		return 0, false, err
	}
	if v, ok := vs.GetLocked(key); ok {
		return v, true, nil
	}
	epoch := vs.epoch
	mu.Unlock()
	v, err = load(key)
	mu.Lock()
	if err != nil {
		return 0, false, err
	}
	// usable sees a Close that ran meanwhile (and released the layer).
	if err := usable(); err != nil {
		return 0, false, err
	}
	return v, vs.CacheLocked(key, v, epoch), nil
}

// StageLocked makes new key's value, visible at once, and stages the
// write for the next commit.
func (vs *Values) StageLocked(key string, new uint64) {
	w := vs.WriteLocked(key, new)
	vs.staged[key] = w
}

// WriteLocked makes new key's value without staging it: a write already
// durable elsewhere (a replayed log record) that the durable state does
// not hold. It returns the write, for LandLocked.
func (vs *Values) WriteLocked(key string, new uint64) Write {
	vs.gen++
	w := Write{Value: new, gen: vs.gen}
	vs.writes[key] = w
	delete(vs.reads, key)
	return w
}

// StagedLocked reports whether a write is staged.
func (vs *Values) StagedLocked() bool { return len(vs.staged) > 0 }

// TakeStagedLocked returns the staged writes, which a commit carries;
// writes staged from now on go to the next one. The caller owns the map.
func (vs *Values) TakeStagedLocked() map[string]Write {
	taken := vs.staged
	vs.staged = make(map[string]Write)
	return taken
}

// LandLocked records that the durable state holds landed: a key whose
// latest write is the one landed leaves the layer, and the cache forgets
// as the layer's Forget says.
func (vs *Values) LandLocked(landed map[string]Write) {
	vs.epoch++
	for k, w := range landed {
		if vs.writes[k].gen == w.gen {
			delete(vs.writes, k)
		}
		if vs.forget == ForgetLanded {
			delete(vs.reads, k)
		}
	}
	if vs.forget == ForgetAtLanding {
		clear(vs.reads)
	}
}

// OverlayLocked returns the latest write of every key with prefix that
// has not landed, for a scan of the durable state to overlay (a value 0
// is a deletion).
func (vs *Values) OverlayLocked(prefix string) map[string]uint64 {
	overlay := make(map[string]uint64)
	for k, w := range vs.writes {
		if strings.HasPrefix(k, prefix) {
			overlay[k] = w.Value
		}
	}
	return overlay
}

// LenLocked returns how many keys the layer holds, written or cached.
func (vs *Values) LenLocked() int { return len(vs.writes) + len(vs.reads) }

// ReleaseLocked drops everything, at Close.
func (vs *Values) ReleaseLocked() {
	vs.writes, vs.staged, vs.reads = nil, nil, nil
}

// MergeScan returns the values of a scan: scanned, what the durable state
// holds under the prefix less the keys of overlay (OverlayLocked), and
// overlay's values that are not deletions, in key order. It takes
// ownership of scanned.
func MergeScan(scanned []store.Value, overlay map[string]uint64) []store.Value {
	if len(overlay) == 0 {
		return scanned
	}
	for k, v := range overlay {
		if v != 0 {
			scanned = append(scanned, store.Value{Key: k, Value: v})
		}
	}
	sort.Slice(scanned, func(i, j int) bool { return scanned[i].Key < scanned[j].Key })
	return scanned
}
