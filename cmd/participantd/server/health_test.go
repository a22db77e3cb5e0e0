package server_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/participantd/participantd/cmd/participantd/server"
)

func TestHealth_Endpoints(t *testing.T) {
	h := start(t, server.Config{})
	c := h.dial()
	other := h.dial()
	cr := c.enroll(5)
	other.enroll(5)
	c.tell(cr, "x")
	other.delivery()

	if code, _ := h.get("/health"); code != http.StatusOK {
		t.Errorf("/health = %d", code)
	}
	if code, _ := h.get("/ready"); code != http.StatusOK {
		t.Errorf("/ready = %d", code)
	}
	code, body := h.get("/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics = %d", code)
	}
	for _, name := range []string{
		server.MetricConnectionsOpen, server.MetricConnectionsTotal, server.MetricOperationsTotal,
		server.MetricCommitLatency + "_bucket", server.MetricCommittedOpsTotal, server.MetricDeliveriesPushed,
		server.MetricStoreFlushes, server.MetricStoreCommits, server.MetricOpsPerFlush,
		server.MetricUnloadable, server.MetricReady,
	} {
		if !strings.Contains(body, "\n"+name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if !strings.Contains(body, server.MetricConnectionsOpen+" 2\n") {
		t.Errorf("/metrics does not count 2 open connections:\n%s", grep(body, server.MetricConnectionsOpen))
	}
	if !strings.Contains(body, server.MetricOperationsTotal+`{op="tell",outcome="ok"} 1`) {
		t.Errorf("/metrics does not count the tell:\n%s", grep(body, server.MetricOperationsTotal))
	}

	code, body = h.get("/unloadable-conversations")
	if code != http.StatusOK {
		t.Fatalf("/unloadable-conversations = %d", code)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatalf("/unloadable-conversations is not JSON: %v: %s", err, body)
	}
	if got["count"] != float64(0) || got["conversations"] == nil {
		t.Errorf("/unloadable-conversations = %s, want count 0 and an empty list", body)
	}
	if list, ok := got["conversations"].([]any); !ok || len(list) != 0 {
		t.Errorf("conversations = %#v, want []", got["conversations"])
	}

	h.shutdown()
	if _, err := http.Get("http://" + h.srv.HealthAddr().String() + "/ready"); err == nil {
		t.Error("health listener still serving after Run returned")
	}
}

func grep(s, word string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
