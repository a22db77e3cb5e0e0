package participant

import (
	"testing"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/registry"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/tokenindex"
)

// FuzzReadRegistry stores any bytes as registry entries, split at the
// positions cuts gives: readRegistry never panics, and what it accepts
// lists each conversation of well-formed entries once, in order.
func FuzzReadRegistry(f *testing.F) {
	var two []byte
	two = append(two, registry.Encode(registry.Entry{Conversation: 1})...)
	two = append(two, registry.Encode(registry.Entry{Conversation: 1 << 63})...)
	f.Add(two, []byte{9})
	f.Add(append(two, registry.Encode(registry.Entry{Conversation: 1})...), []byte{9})
	f.Add([]byte{registry.Version, 0, 0}, []byte{3})
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0, 1}, []byte{9})
	f.Fuzz(func(t *testing.T, data, cuts []byte) {
		st := store.NewMemory()
		var payloads [][]byte
		for i := 0; len(data) > 0 && i < 64; i++ {
			n := len(data)
			if len(cuts) > 0 {
				n = max(1, min(n, int(cuts[i%len(cuts)])))
			}
			payloads = append(payloads, data[:n])
			if _, err := st.Append(registry.Stream, data[:n], uint64(i)); err != nil {
				t.Fatal(err)
			}
			data = data[n:]
		}
		ids, err := readRegistry(st)
		if err != nil {
			return
		}
		seen := map[ConversationID]bool{}
		var want []ConversationID
		for _, p := range payloads {
			e, err := registry.Decode(p)
			if err != nil {
				t.Fatalf("readRegistry accepted entry %x: %v", p, err)
			}
			id := e.Conversation
			if !seen[id] {
				seen[id] = true
				want = append(want, id)
			}
		}
		if len(ids) != len(want) {
			t.Fatalf("readRegistry = %v, want %v", ids, want)
		}
		for i := range ids {
			if ids[i] != want[i] {
				t.Fatalf("readRegistry = %v, want %v", ids, want)
			}
		}
	})
}

// FuzzLookupToken stores any token index value and any oplog rows, then
// looks a token up: lookupToken never panics, and a row it returns is a
// committed row (below applied) that carries the token.
func FuzzLookupToken(f *testing.F) {
	tok := Token{1, 2, 3}
	row := func(r oplog.Row) []byte {
		b, err := oplog.Encode(&r)
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	genesis := row(oplog.Row{Kind: oplog.KindGenesis})
	tell := row(oplog.Row{Kind: oplog.KindTell, Participant: 0, Generation: 1, Token: tok, Seq: 3, Payload: []byte("x")})
	f.Add(uint64(2), uint64(2), genesis, tell, tok[:])
	f.Add(uint64(2), uint64(1), genesis, tell, tok[:])            // row not yet applied
	f.Add(uint64(1), uint64(2), genesis, tell, tok[:])            // index names the genesis row
	f.Add(^uint64(0), uint64(2), genesis, tell, tok[:])           // index past any row
	f.Add(uint64(2), uint64(2), genesis, []byte{1, 0xc1}, tok[:]) // corrupt row
	f.Add(uint64(0), uint64(0), []byte{}, []byte{}, []byte{})
	f.Fuzz(func(t *testing.T, value, applied uint64, row0, row1, token []byte) {
		st := store.NewMemory()
		var tk Token
		copy(tk[:], token)
		const c = ConversationID(5)
		key := tokenindex.Key(c, tokenindex.Participant(0), tk)
		if value != 0 {
			if err := st.CAS(key, 0, value); err != nil {
				t.Fatal(err)
			}
		}
		for i, r := range [][]byte{row0, row1} {
			if len(r) == 0 {
				break
			}
			if _, err := st.Append(oplog.Stream(c), r, uint64(i)); err != nil {
				t.Fatal(err)
			}
		}
		s := &Service{st: st}
		p, w, err := s.lookupToken(c, applied, tokenindex.Key(c, tokenindex.Participant(0), tk), func(*oplog.Row) bool { return true }, tk)
		if w.key != key || w.old != value {
			t.Fatalf("lookupToken write = %+v, want key %q old %d", w, key, value)
		}
		if err != nil || p == nil {
			return
		}
		if p.idx >= applied || p.idx+1 != value || p.row.Token != tk || !p.row.Kind.HasToken() {
			t.Fatalf("lookupToken = row %d %+v for value %d applied %d token %v", p.idx, p.row, value, applied, tk)
		}
	})
}
