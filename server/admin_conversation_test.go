package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

// getAdmin GETs path from the health listener at base (http://host:port)
// with the admin token, when one is given.
func getAdmin(t *testing.T, base, path, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (h *harness) base() string { return "http://" + h.srv.HealthAddr().String() }

// conversationStatus GETs /admin/conversations/{conv} with the admin token
// and decodes a 200 answer.
func conversationStatus(t *testing.T, h *harness, conv string) server.ConversationStatus {
	t.Helper()
	code, body := getAdmin(t, h.base(), "/admin/conversations/"+conv, "s3cret")
	if code != http.StatusOK {
		t.Fatalf("GET /admin/conversations/%s = %d %q, want 200", conv, code, body)
	}
	var st server.ConversationStatus
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("status body %q: %v", body, err)
	}
	return st
}

// TestAdmin_ConversationStatus_SingleNode: through the real health
// listener, a single node reports a conversation's participants, their
// bindings and cursors (what its reader acknowledged and was pushed) and
// its backlog, behind the admin token; an unknown conversation is 404, a
// bad id 400, and no secret is in the answer.
func TestAdmin_ConversationStatus_SingleNode(t *testing.T) {
	h := start(t, server.Config{AdminToken: "s3cret"})
	if code, _ := getAdmin(t, h.base(), "/admin/conversations/9", ""); code != http.StatusUnauthorized {
		t.Errorf("status without the admin token = %d, want 401", code)
	}
	if code, _ := getAdmin(t, h.base(), "/admin/conversations/9", "wrong"); code != http.StatusUnauthorized {
		t.Errorf("status with a wrong admin token = %d, want 401", code)
	}
	if code, body := getAdmin(t, h.base(), "/admin/conversations/9", "s3cret"); code != http.StatusNotFound {
		t.Errorf("status of an unknown conversation = %d %q, want 404", code, body)
	}
	if code, _ := getAdmin(t, h.base(), "/admin/conversations/nine", "s3cret"); code != http.StatusBadRequest {
		t.Errorf("status of a non-numeric id = %d, want 400", code)
	}

	tx, rx := h.dial(), h.dial()
	sender := tx.enroll(9)
	reader := rx.enroll(9)
	var last uint64
	for _, p := range []string{"one", "two", "three"} {
		last = tx.tell(sender, p).Seq
	}
	// The sender was pushed the reader's joined, and never acknowledges it.
	joined := tx.deliveryWhere(func(d *wire.Delivery) bool { return d.Kind == wire.KindJoined })
	first := rx.deliveryWhere(func(d *wire.Delivery) bool { return d.Kind == wire.KindRecord })
	rx.deliveryWhere(func(d *wire.Delivery) bool { return d.Seq == last })
	if a, ok := rx.call(&wire.Ack{ID: rx.id(), Conversation: 9, Participant: reader.p, Generation: reader.gen, Through: first.Seq}).(*wire.Acked); !ok {
		t.Fatalf("ack answered %#v", a)
	}

	got := conversationStatus(t, h, "9")
	if got.Participants == nil || got.Participants[0].Connection == "" || got.Participants[1].Connection == "" {
		t.Fatalf("status = %+v, want both participants bound on a connection", got)
	}
	// Seqs: 1 the sender joined, 2 the reader joined (to the sender, who
	// never reads), 3..5 the records (to the reader).
	want := server.ConversationStatus{
		Conversation: 9, Here: true, Loaded: true, OplogRows: 7, LastSeq: 5,
		Backlog: server.ConversationBacklog{Records: 4, FirstSeq: 2, MemoryBytes: int64(len("onetwothree"))},
		Participants: []server.ParticipantStatus{
			{Participant: sender.p, Generation: 1, Bound: true, Connection: got.Participants[0].Connection, Offered: joined.Seq, Unacked: 1},
			{Participant: reader.p, Generation: 1, Bound: true, Connection: got.Participants[1].Connection, Acked: 3, Offered: 5, Unacked: 2},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("status (-want +got):\n%s", diff)
	}
	_, body := getAdmin(t, h.base(), "/admin/conversations/9", "s3cret")
	for _, secret := range []wire.Secret{sender.secret, reader.secret} {
		if strings.Contains(body, string(secret[:])) || strings.Contains(body, strings.TrimSpace(mustJSON(t, secret))) {
			t.Errorf("status body holds a participant's secret: %s", body)
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestAdmin_ConversationStatus_NonOwnerNamesTheOwner: two nodes over one
// etcd. The owner answers the status of its conversation; the other node
// answers that it does not serve it and names the owner, with its wire
// address and the URL of its health listener, without claiming it (the
// owner keeps serving). Once the owner drained and released it, nobody
// owns it, and asking still claims nothing; with etcd down, the non-owner
// answers 503 and names etcd.
func TestAdmin_ConversationStatus_NonOwnerNamesTheOwner(t *testing.T) {
	etcd := startEtcd(t)
	cfg := func(id string) server.Config {
		return server.Config{AdminToken: "s3cret",
			Cluster: server.ClusterConfig{Endpoints: etcd.Endpoints(), NodeID: id, Prefix: "/pd/", LeaseTTL: 2 * time.Second}}
	}
	a := start(t, cfg("a"))
	b := start(t, cfg("b"))
	if code, _ := getAdmin(t, b.base(), "/admin/conversations/42", "s3cret"); code != http.StatusNotFound {
		t.Errorf("status of a conversation nobody created = %d, want 404", code)
	}
	ca := a.dial()
	cr := ca.enroll(42)
	ca.tell(cr, "hello")

	owner := &server.ConversationOwner{Node: "a", Addr: a.srv.Addr().String(), Health: a.base()}
	onA := conversationStatus(t, a, "42")
	if !onA.Here || onA.Node != "a" || !cmp.Equal(onA.Owner, owner) || len(onA.Participants) != 1 || !onA.Participants[0].Bound {
		t.Errorf("status on the owner = %+v, want here, owner %+v, its one participant bound", onA, owner)
	}
	onB := conversationStatus(t, b, "42")
	want := server.ConversationStatus{Conversation: 42, Node: "b", Owner: owner}
	if diff := cmp.Diff(want, onB); diff != "" {
		t.Errorf("status on the non-owner (-want +got):\n%s", diff)
	}
	// Asking b claimed nothing: a still serves the conversation.
	ca.tell(cr, "still here")

	if err := a.shutdown(); err != nil {
		t.Fatalf("a drained with %v", err)
	}
	nobody := conversationStatus(t, b, "42")
	if nobody.Here || nobody.Owner != nil {
		t.Errorf("status after the owner released it = %+v, want no owner", nobody)
	}
	if again := conversationStatus(t, b, "42"); again.Here || again.Owner != nil {
		t.Errorf("status asked again = %+v, want still no owner: asking must not claim", again)
	}

	// Without etcd a node that does not serve the conversation cannot
	// tell who does: it says so, and says why. etcd comes back before the
	// shutdown, so that b's drain does not wait out its timeouts.
	etcd.Stop(0)
	code, body := getAdmin(t, b.base(), "/admin/conversations/42", "s3cret")
	if err := etcd.Restart(0); err != nil {
		t.Fatalf("etcd restart: %v", err)
	}
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "etcd") {
		t.Errorf("status with etcd down = %d %q, want 503 naming etcd", code, body)
	}
}
