package etcdstore

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/store"
)

// The committer: one goroutine takes everything staged, packs it scope by
// scope into etcd transactions within the cluster's limits, runs them in
// order, and applies each scope's outcome. See doc.go for what is atomic.

// scopeWork is what one commit writes of one scope.
type scopeWork struct {
	sc     *scope
	epoch  uint64
	staged uint64 // the scope's staged count when taken: durable on success
	fence  *Fence
	// fenceMod is the fence key's mod revision the commit compares.
	// resettle is set when a refusal found the claim's key at another mod
	// revision (written behind the store, see explainRefusal).
	fenceMod int64
	resettle bool
	// exact is set when the scope was loaded under its fence (see
	// scope.exact): the fence compare alone keeps its streams from
	// forking, so its runs and values are not compared.
	exact bool
	// log is the scope's writes in order; streams, values, trims and
	// bytes are what the commit writes of each, gathered from it
	// (gatherLocked), and for a scope cut over several transactions the
	// writes of each stretch (packInOrder).
	log     []write
	streams []*streamWork
	values  []*valueWork
	trims   []*trimWork
	bytes   []*bytesWork
	// rev is the scope's revision when the commit began: a byte value
	// commits only if etcd's copy is no newer. committed is the highest
	// revision a transaction of the scope committed at.
	rev       int64
	committed int64
	err       error
}

// trimWork is a stream's staged trim: delete its runs below the one
// holding below (which starts at run) and record below as its floor.
type trimWork struct {
	name  string
	below uint64
	run   uint64
}

// bytesWork is one byte value's write (gen is the PutBytes count it
// carries; val nil deletes). after is the transaction of the same commit
// that wrote the value before this one, if any (packInOrder): this one
// then compares the value against that transaction's revision.
type bytesWork struct {
	bv    *byteValue
	name  string
	val   []byte
	gen   uint64
	after *txnPlan
}

// streamWork is a stream's entries base.. being written; done counts those
// committed so far.
type streamWork struct {
	st   *stream
	name string
	base uint64
	ents [][]byte
	done int
}

// valueWork is one value's write from old to new (gen is the CAS count it
// carries).
type valueWork struct {
	v        *value
	name     string
	old, new uint64
	gen      uint64
	done     bool
}

// item is one piece of a transaction: a fence compare, a value write, or a
// chunk of a stream's entries (one or more runs).
type item struct {
	sw    *scopeWork
	fence bool
	vw    *valueWork
	swk   *streamWork
	tw    *trimWork
	bw    *bytesWork
	from  int // chunk: the first entry of swk.ents
	n     int // chunk: how many entries
}

// txnPlan is the items of one transaction and its cost so far.
type txnPlan struct {
	items []item
	cmps  int // compares (and as many reads back if refused)
	puts  int
	bytes int
	has   map[*scopeWork]bool
	// rev is the revision the transaction committed at, once it has.
	rev int64
}

func (s *Store) run() {
	defer close(s.done)
	finished := make(chan struct{}, s.opts.MaxInflightCommits)
	for {
		select {
		case <-s.quit:
			s.mu.Lock()
			active := s.active
			s.mu.Unlock()
			for range active {
				<-finished
			}
			return
		case <-s.kick:
		case <-finished:
			s.mu.Lock()
			s.active--
			s.mu.Unlock()
		}
		s.mu.Lock()
		for s.active < s.opts.MaxInflightCommits {
			work := s.takeLocked()
			if len(work) == 0 {
				break
			}
			s.active++
			go func() {
				s.commit(work)
				s.mu.Lock()
				s.applyLocked(work)
				s.broadcastLocked()
				s.mu.Unlock()
				finished <- struct{}{}
			}()
		}
		s.mu.Unlock()
	}
}

// takeLocked moves every staged write of the scopes no commit is writing
// into the commit about to run.
func (s *Store) takeLocked() []*scopeWork {
	wanted := false
	for _, c := range s.scopes {
		if c.wanted && c.err == nil && c.dirty() && c.inflight == nil {
			wanted = true
			break
		}
	}
	if !wanted {
		return nil
	}
	var work []*scopeWork
	for _, c := range s.scopes {
		if c.err != nil || !c.dirty() || c.inflight != nil {
			continue
		}
		sw := &scopeWork{sc: c, epoch: c.epoch, staged: c.staged, rev: c.rev}
		if c.fenced {
			f := c.claim
			sw.fence, sw.fenceMod, sw.exact = &f, c.fenceMod, c.exact
		}
		sw.log, c.log, c.logHint = c.log, nil, len(c.log)
		sw.gatherLocked()
		c.inflight, c.wanted = sw, false
		work = append(work, sw)
	}
	return work
}

// applyLocked records the outcome of a commit: committed prefixes become
// the streams' committed lengths, written values their committed values,
// and a failed scope keeps its error.
func (s *Store) applyLocked(work []*scopeWork) {
	for _, sw := range work {
		c := sw.sc
		c.readEpoch++
		if !c.exact || len(c.reads) > maxKeptReads {
			// Values read may have changed behind a scope the store
			// does not write alone; an exact scope's change only by its
			// CASes, which drop them from reads (a token window's
			// floor, say, is then read once, not once per batch).
			clear(c.reads)
		}
		if c.inflight == sw {
			c.inflight = nil
		}
		if sw.fence != nil && *sw.fence == c.claim && (sw.resettle || errors.Is(sw.err, ErrUnknownOutcome)) {
			// The transaction may yet apply (or the fence key moved on):
			// whatever the scope's state, it is settled before it is read
			// again.
			c.unsettled = true
		}
		if c.epoch != sw.epoch {
			// Reset or failed meanwhile: the scope starts over from etcd.
			continue
		}
		if sw.err != nil {
			s.failLocked(c, sw.err)
			continue
		}
		c.rev = max(c.rev, sw.committed)
		for _, bw := range sw.bytes {
			if bw.bv.gen == bw.gen && c.bytes[bw.name] == bw.bv {
				// Not written since: etcd holds it.
				delete(c.bytes, bw.name)
			}
		}
		for _, swk := range sw.streams {
			swk.st.committed += uint64(swk.done)
			swk.st.pending = swk.st.pending[swk.done:]
			swk.st.taken = 0
		}
		for _, vw := range sw.values {
			if vw.new != 0 {
				// Before the value leaves c.values: a read of it must not
				// find it absent.
				s.knownLocked(c, vw.name)
			}
			vw.v.committed = vw.new
			if vw.v.gen == vw.gen {
				// No CAS since: nothing of this value is in flight any
				// more, so etcd holds it and the entry can go.
				delete(c.values, vw.name)
			}
		}
		c.durable = max(c.durable, sw.staged)
	}
}

// maxKeptReads bounds the values an exact scope keeps read across its
// commits.
const maxKeptReads = 64

// maxConcurrentTxns bounds the transactions of one commit in flight at once.
const maxConcurrentTxns = 16

// commit writes work as transactions, setting each scope's err and each
// write's progress. Transactions of disjoint scopes run concurrently; the
// chunks of a scope split over several transactions run in order, each
// after the one before it, so that each compares no run past the length
// the previous one wrote.
func (s *Store) commit(work []*scopeWork) {
	plans := s.pack(work)
	if len(plans) == 1 {
		s.runTxn(plans[0])
		return
	}
	last := make(map[*scopeWork]chan struct{})
	sem := make(chan struct{}, maxConcurrentTxns)
	var wg sync.WaitGroup
	for _, p := range plans {
		var deps []chan struct{}
		done := make(chan struct{})
		for sw := range p.has {
			if ch, ok := last[sw]; ok {
				deps = append(deps, ch)
			}
			last[sw] = done
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(done)
			for _, d := range deps {
				<-d
			}
			sem <- struct{}{}
			s.runTxn(p)
			<-sem
		}()
	}
	wg.Wait()
}

// kvCost is the cost of a key/value pair in a request, framing and the
// value's seal included.
func kvCost(key string, val int) int { return len(key) + val + SealOverhead + 32 }

func (s *Store) newPlan() *txnPlan { return &txnPlan{has: make(map[*scopeWork]bool)} }

// fits reports whether plan can take cmps compares, puts writes and bytes
// more.
func (s *Store) fits(p *txnPlan, cmps, puts, bytes int) bool {
	return p.cmps+cmps <= s.opts.MaxTxnOps && p.puts+puts <= s.opts.MaxTxnOps &&
		p.bytes+bytes <= s.opts.MaxRequestBytes-payloadReserve/2
}

// pack lays work out as transactions. A scope goes whole into one
// transaction when it fits one, with other scopes while they fit; a scope
// that alone passes a limit is cut along its log (packInOrder), so that
// each of its transactions holds the writes that follow the previous
// one's.
func (s *Store) pack(work []*scopeWork) []*txnPlan {
	var plans []*txnPlan
	cur := s.newPlan()
	push := func() {
		if len(cur.items) > 0 {
			plans = append(plans, cur)
		}
		cur = s.newPlan()
	}
	for _, sw := range work {
		cmps, puts, bytes := s.scopeCost(sw)
		if !s.fits(&txnPlan{}, cmps, puts, bytes) { // alone, in an empty transaction
			push()
			var err error
			if plans, err = s.packInOrder(sw, plans); err != nil {
				sw.err = err
			}
			continue
		}
		if !s.fits(cur, cmps, puts, bytes) {
			push()
		}
		cur.has[sw] = true
		if sw.fence != nil {
			cur.items = append(cur.items, item{sw: sw, fence: true})
		}
		for _, vw := range sw.values {
			cur.items = append(cur.items, item{sw: sw, vw: vw})
		}
		for _, tw := range sw.trims {
			cur.items = append(cur.items, item{sw: sw, tw: tw})
		}
		for _, bw := range sw.bytes {
			cur.items = append(cur.items, item{sw: sw, bw: bw})
		}
		for _, swk := range sw.streams {
			cur.items = append(cur.items, item{sw: sw, swk: swk, n: len(swk.ents)})
		}
		cur.cmps, cur.puts, cur.bytes = cur.cmps+cmps, cur.puts+puts, cur.bytes+bytes
	}
	push()
	return plans
}

// valueCmps is how many compares a value write or a chunk of a stream's
// entries adds to a transaction of sw: none when the fence alone guards
// the scope (sw.exact), else the compare of its old value or of no run at
// or after the stream's length.
func (s *Store) valueCmps(sw *scopeWork) int {
	if sw.exact {
		return 0
	}
	return 1
}

// trimCost is what a trim costs a transaction: the compare of the floor's
// run (and its read back), one DeleteRange of two keys and the floor's
// put.
func (s *Store) trimCost(sw *scopeWork, tw *trimWork) (cmps, puts, bytes int) {
	return 1, 2, 4*kvCost(s.lay.entryPrefix(sw.sc.name, tw.name), 8) + kvCost(s.lay.floorKey(sw.sc.name, tw.name), 8)
}

// bytesCost is what a byte value costs: its compare and read back, and
// its put.
func (s *Store) bytesCost(sw *scopeWork, bw *bytesWork) (cmps, puts, bytes int) {
	key := s.lay.bytesKey(sw.sc.name, bw.name)
	return 1, 1, 2*kvCost(key, 8) + kvCost(key, len(bw.val))
}

func (s *Store) scopeCost(sw *scopeWork) (cmps, puts, bytes int) {
	if sw.fence != nil {
		cmps, bytes = 1, kvCost(sw.fence.Key, 16)
	}
	for _, vw := range sw.values {
		cmps += s.valueCmps(sw)
		puts++
		bytes += 2 * kvCost(s.lay.valueKey(sw.sc.name, vw.name), 8)
	}
	for _, tw := range sw.trims {
		c, p, b := s.trimCost(sw, tw)
		cmps, puts, bytes = cmps+c, puts+p, bytes+b
	}
	for _, bw := range sw.bytes {
		c, p, b := s.bytesCost(sw, bw)
		cmps, puts, bytes = cmps+c, puts+p, bytes+b
	}
	for _, swk := range sw.streams {
		prefix := s.lay.entryPrefix(sw.sc.name, swk.name)
		head := kvCost(prefix, 8+runOverhead)
		cmps += s.valueCmps(sw)
		bytes += head
		runs := len(runLens(swk.ents, s.opts.MaxRunBytes))
		puts += runs
		bytes += runs * head
		for _, e := range swk.ents {
			bytes += entryCost(len(e))
		}
	}
	return cmps, puts, bytes
}

// runTxn runs the items of plan whose scopes have not failed, retrying
// without the scopes whose compares failed, until it commits, has nothing
// left, or its outcome is unknown.
//
// The transaction carries no Else: on the success path (nearly every
// commit) Else reads would only be bytes that every member unmarshals and
// logs. When it is refused, one linearizable read of the compared keys
// says which compares fail now (see explainRefusal).
func (s *Store) runTxn(plan *txnPlan) {
	for {
		var (
			cmps   []clientv3.Cmp
			thens  []clientv3.Op
			checks []check
			live   []item
		)
		for _, it := range plan.items {
			if it.sw.err != nil {
				continue
			}
			live = append(live, it)
			sc := it.sw.sc.name
			switch {
			case it.fence:
				// The mod revision names one version of the claim's key: a
				// claim gone or recreated, or a settle since, refuses it.
				f := it.sw.fence
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(f.Key), "=", it.sw.fenceMod))
				checks = append(checks, check{sw: it.sw, key: f.Key, keysOnly: true, fence: true, createRev: f.CreateRevision, modRev: it.sw.fenceMod})
			case it.vw != nil:
				vw := it.vw
				key := s.lay.valueKey(sc, vw.name)
				if !it.sw.exact {
					cmps = append(cmps, s.cmpU64(key, vw.old))
					checks = append(checks, s.checkU64(it.sw, key, vw.old))
				}
				if vw.new == 0 {
					thens = append(thens, clientv3.OpDelete(key))
				} else {
					thens = append(thens, clientv3.OpPut(key, s.sealU64(key, vw.new)))
				}
			case it.tw != nil:
				// The run holding the floor stays, so the stream keeps
				// its last entry whatever etcd holds; the floor key says
				// where, within it, the stream's entries begin.
				prefix := s.lay.entryPrefix(sc, it.tw.name)
				run := entryKey(prefix, it.tw.run)
				cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(run), ">", 0))
				checks = append(checks, check{sw: it.sw, key: run, keysOnly: true, exists: true})
				thens = append(thens, clientv3.OpDelete(prefix, clientv3.WithRange(run)))
				fk := s.lay.floorKey(sc, it.tw.name)
				thens = append(thens, clientv3.OpPut(fk, s.sealU64(fk, it.tw.below)))
			case it.bw != nil:
				bw, rev := it.bw, it.sw.rev
				if bw.after != nil {
					// Written by an earlier transaction of this commit,
					// which ran before this one and committed.
					rev = max(rev, bw.after.rev)
				}
				key := s.lay.bytesKey(sc, bw.name)
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "<", rev+1))
				checks = append(checks, check{sw: it.sw, key: key, keysOnly: true, maxModRev: rev})
				if len(bw.val) == 0 {
					thens = append(thens, clientv3.OpDelete(key))
				} else {
					thens = append(thens, clientv3.OpPut(key, s.seal(key, bw.val)))
				}
			default:
				swk := it.swk
				base := swk.base + uint64(it.from)
				prefix := s.lay.entryPrefix(sc, swk.name)
				if !it.sw.exact {
					// No run at or after base: nobody else wrote the
					// stream past the length this store knows (a writer
					// that knew less compares a range holding this
					// store's runs, and is refused).
					from, end := entryKey(prefix, base), clientv3.GetPrefixRangeEnd(prefix)
					cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(from), "=", 0).WithRange(end))
					checks = append(checks, check{sw: it.sw, key: from, end: end, keysOnly: true, none: true})
				}
				ents := swk.ents[it.from : it.from+it.n]
				seq := base
				for _, n := range runLens(ents, s.opts.MaxRunBytes) {
					rk := entryKey(prefix, seq)
					thens = append(thens, clientv3.OpPut(rk, s.sealRun(rk, ents[:n])))
					ents, seq = ents[n:], seq+uint64(n)
				}
			}
		}
		if len(live) == 0 {
			return
		}
		kv, lc := s.commitKV()
		ctx, cancel := s.ctx()
		began := time.Now()
		resp, err := kv.Txn(ctx).If(cmps...).Then(thens...).Commit()
		cancel()
		s.commitDone(lc, err)
		s.txns.Add(1)
		if err != nil {
			err = fmt.Errorf("%w: %w: %w", store.ErrFailed, ErrUnknownOutcome, err)
			for _, it := range live {
				it.sw.err = err
			}
			s.observeTxn(began, len(cmps)+len(thens), err)
			return
		}
		if resp.Succeeded {
			s.commits.Add(1)
			plan.rev = resp.Header.Revision
			for _, it := range live {
				it.sw.committed = max(it.sw.committed, resp.Header.Revision)
				switch {
				case it.vw != nil:
					it.vw.done = true
				case it.swk != nil:
					it.swk.done += it.n
				}
			}
			s.observeTxn(began, len(cmps)+len(thens), nil)
			return
		}
		refused := s.explainRefusal(checks)
		if refused == nil {
			// Every compare holds when read back after the refusal: no
			// scope can be blamed alone. Fail all; nothing was written.
			refused = fmt.Errorf("%w: %w: refused transaction whose compares hold when read back", store.ErrFailed, ErrConflict)
			for _, it := range live {
				it.sw.err = refused
			}
		}
		s.observeTxn(began, len(cmps)+len(thens), refused)
	}
}

// settle makes sure that no transaction sent under fence f before the call
// can commit afterwards: it writes f's key (its value and lease kept), so
// that the key's mod revision passes every one those transactions compare.
// A transaction whose outcome was unknown has then either applied before
// the settle, and a linearizable read after it sees it, or never will. It
// returns the key's new mod revision, or an error wrapping ErrFenced when
// f's claim is gone (nothing written), or the call's error (the settle's
// own outcome is unknown; settling again is safe).
func (s *Store) settle(sc string, f Fence) (int64, error) {
	kv, lc := s.commitKV()
	ctx, cancel := s.ctx()
	resp, err := kv.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(f.Key), "=", f.CreateRevision)).
		Then(clientv3.OpPut(f.Key, "", clientv3.WithIgnoreValue(), clientv3.WithIgnoreLease())).Commit()
	cancel()
	s.commitDone(lc, err)
	if err != nil {
		return 0, fmt.Errorf("etcdstore: settle scope %q after a commit of unknown outcome: %w", sc, err)
	}
	s.settles.Add(1)
	if !resp.Succeeded {
		return 0, fmt.Errorf("%w: %w: scope %q", store.ErrFailed, ErrFenced, sc)
	}
	return resp.Header.Revision, nil
}

// check is one compare of a transaction, as explainRefusal reads it back:
// the fence's mod revision (and the claim's create revision), a value
// (its sealed 8-byte encoding, absent for 0), a trim floor's run that
// must exist, no run in [key, end) of a stream, or a byte value's highest
// mod revision.
type check struct {
	sw        *scopeWork
	key       string
	end       string
	none      bool
	keysOnly  bool
	fence     bool
	createRev int64
	modRev    int64
	u64       bool
	want      uint64
	sealed    string // want sealed under key, when want is not 0
	exists    bool
	maxModRev int64
}

// holds reports whether the compare holds for what a read of its key
// returned (nil: absent).
func (c *check) holds(kv *mvccpb.KeyValue) bool {
	switch {
	case c.fence:
		return kv != nil && kv.ModRevision == c.modRev
	case c.u64:
		if c.want == 0 {
			return kv == nil
		}
		return kv != nil && string(kv.Value) == c.sealed
	case c.exists:
		return kv != nil
	case c.none:
		return kv == nil
	default:
		return kv == nil || kv.ModRevision <= c.maxModRev
	}
}

// explainRefusal reads the compared keys of a refused transaction back
// (one linearizable read, after the refusal) and fails the scope of every
// compare that does not hold: ErrFenced for a fence, ErrConflict for the
// rest. It returns the last error it set, nil when every compare holds or
// the read fails.
//
// The read is later than the refusal, so it sees at least as much: a fence
// once gone or moved never returns to the same mod revision, a stream's runs
// past a length stay (a trim keeps the last) and a byte value's revision
// only grows, a trimmed run stays gone; so a
// compare that failed still fails. A compare that held then may fail now
// (another writer got in since): its scope fails a commit early that it
// would have failed at the next. Where nothing fails now (a value changed
// and changed back; the read itself failed), every scope of the
// transaction fails: the refusal is never blamed on nobody.
func (s *Store) explainRefusal(checks []check) error {
	ops := make([]clientv3.Op, len(checks))
	for i := range checks {
		switch {
		case checks[i].none:
			ops[i] = clientv3.OpGet(checks[i].key, clientv3.WithRange(checks[i].end), clientv3.WithLimit(1), clientv3.WithKeysOnly())
		case checks[i].keysOnly:
			ops[i] = clientv3.OpGet(checks[i].key, clientv3.WithKeysOnly())
		default:
			ops[i] = clientv3.OpGet(checks[i].key)
		}
	}
	kv, lc := s.commitKV()
	ctx, cancel := s.ctx()
	resp, err := kv.Txn(ctx).Then(ops...).Commit()
	cancel()
	s.commitDone(lc, err)
	if err != nil || len(resp.Responses) != len(checks) {
		s.log.Warn().Err(err).Msg("reading back the compares of a refused transaction failed; failing all its scopes")
		return nil
	}
	var refused error
	for i, r := range resp.Responses {
		c := &checks[i]
		var kv *mvccpb.KeyValue
		if kvs := r.GetResponseRange().GetKvs(); len(kvs) > 0 {
			kv = kvs[0]
		}
		if c.sw.err != nil || c.holds(kv) {
			continue
		}
		switch {
		case c.fence && kv != nil && kv.CreateRevision == c.createRev:
			// The claim stands, written since at a revision this commit
			// did not compare: not fenced off. The scope settles again,
			// which learns the fence's mod revision anew.
			c.sw.err = fmt.Errorf("%w: %w: scope %q: its fence key was written behind the store", store.ErrFailed, ErrConflict, c.sw.sc.name)
			c.sw.resettle = true
		case c.fence:
			c.sw.err = fmt.Errorf("%w: %w: scope %q", store.ErrFailed, ErrFenced, c.sw.sc.name)
		default:
			c.sw.err = fmt.Errorf("%w: %w: scope %q", store.ErrFailed, ErrConflict, c.sw.sc.name)
		}
		refused = c.sw.err
	}
	return refused
}

func (s *Store) observeTxn(began time.Time, ops int, err error) {
	if s.opts.OnTxn != nil {
		s.opts.OnTxn(time.Since(began), ops, err)
	}
}

// cmpU64 compares key against v in this layout: absent for 0, else the
// sealed 8-byte encoding (the trailer is a function of key and v, so the
// bytes etcd compares are the bytes a put of v wrote).
func (s *Store) cmpU64(key string, v uint64) clientv3.Cmp {
	if v == 0 {
		return clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
	}
	return clientv3.Compare(clientv3.Value(key), "=", s.sealU64(key, v))
}

// checkU64 is the check of cmpU64(key, v), for explainRefusal.
func (s *Store) checkU64(sw *scopeWork, key string, v uint64) check {
	c := check{sw: sw, key: key, u64: true, want: v}
	if v != 0 {
		c.sealed = s.sealU64(key, v)
	}
	return c
}
