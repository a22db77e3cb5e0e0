package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

// postAdmin posts to an admin endpoint and returns the status and body.
func (h *harness) postAdmin(path, token string) (int, string) {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+h.srv.HealthAddr().String()+path, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The operator's way out of a deaf member (issue 18, item 1): one address
// filled its share with a deaf member; the operator evicts that member
// online through the admin endpoint (the request logged with who and
// what), the teller receives left with cause evicted, the records only the
// deaf member held are reclaimed, so the address's next tell commits, and
// the evicted credential is retired. Dropping a conversation evicts all
// its members. Without the admin token nothing is evicted.
func TestEvict_OperatorFreesAShareOnline(t *testing.T) {
	const budget, admin = 400, "adm1n"
	logs := &lockedBuffer{}
	h := start(t, server.Config{BacklogRecords: budget, LimitLoopback: true, AdminToken: admin, Logger: zerolog.New(logs)})
	deaf, teller := h.dialFrom("127.0.0.1"), h.dialFrom("127.0.0.1")
	rx := deaf.enroll(1)
	tx := teller.enroll(1)
	refused := func() *wire.Error {
		a := teller.call(&wire.Tell{ID: teller.id(), Conversation: 1, Participant: tx.p, Generation: tx.gen, Token: token(), Payload: []byte("x")})
		e, _ := a.(*wire.Error)
		return e
	}
	for i := 0; ; i++ {
		if e := refused(); e != nil {
			if e.Code != wire.CodeBacklogFull {
				t.Fatalf("tell refused %#v, want backlog_full", e)
			}
			break
		}
		if i > budget {
			t.Fatalf("%d tells to a deaf member committed, past the address's share", i)
		}
	}

	if code, _ := h.postAdmin("/admin/evict?conversation=1&participant=0", "wrong"); code != http.StatusUnauthorized {
		t.Fatalf("evict with a wrong token = %d, want 401", code)
	}
	code, body := h.postAdmin("/admin/evict?conversation=1&participant=0", admin)
	if code != http.StatusOK {
		t.Fatalf("POST /admin/evict = %d %s, want 200", code, body)
	}
	var ev struct{ Conversation, Participant, Seq uint64 }
	if err := json.Unmarshal([]byte(body), &ev); err != nil || ev.Conversation != 1 || ev.Participant != rx.p || ev.Seq == 0 {
		t.Fatalf("POST /admin/evict answered %s (%v)", body, err)
	}
	if !strings.Contains(logs.String(), `"message":"admin: participant evicted"`) || !strings.Contains(logs.String(), `"remote":"127.0.0.1:`) {
		t.Errorf("the eviction is not in the log with who asked:\n%s", logs.String())
	}
	left := teller.deliveryWhere(func(d *wire.Delivery) bool { return d.Kind == wire.KindLeft })
	if left.Participant != rx.p || left.Seq != ev.Seq || left.Cause == nil || *left.Cause != wire.CauseEvicted {
		t.Errorf("the teller got %#v, want left of %d at seq %d with cause evicted", left, rx.p, ev.Seq)
	}
	if e := refused(); e != nil {
		t.Fatalf("a tell once the deaf member was evicted: refused %#v, want told", e)
	}
	a := deaf.call(&wire.Tell{ID: deaf.id(), Conversation: 1, Participant: rx.p, Generation: rx.gen, Token: token(), Payload: []byte("y")})
	if e, ok := a.(*wire.Error); !ok || e.Code != wire.CodeRetired {
		t.Errorf("the evicted participant's tell answered %#v, want retired", a)
	}
	if code, body := h.postAdmin("/admin/evict?conversation=1&participant=0", admin); code != http.StatusConflict || !strings.Contains(body, `"retired"`) {
		t.Errorf("evicting again = %d %s, want 409 retired", code, body)
	}

	code, body = h.postAdmin("/admin/drop?conversation=1", admin)
	if code != http.StatusOK || !strings.Contains(body, `"participant":`+jsonUint(tx.p)) {
		t.Fatalf("POST /admin/drop = %d %s, want 200 evicting %d", code, body, tx.p)
	}
	a = teller.call(&wire.Tell{ID: teller.id(), Conversation: 1, Participant: tx.p, Generation: tx.gen, Token: token(), Payload: []byte("z")})
	if e, ok := a.(*wire.Error); !ok || e.Code != wire.CodeRetired {
		t.Errorf("a tell in a dropped conversation answered %#v, want retired", a)
	}
	if code, _ := h.postAdmin("/admin/drop?conversation=77", admin); code != http.StatusNotFound {
		t.Errorf("dropping a conversation that does not exist = %d, want 404", code)
	}
}

func jsonUint(v uint64) string {
	b, _ := json.Marshal(v)
	return string(b)
}
