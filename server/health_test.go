package server_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/participantd/participantd/server"
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
		server.MetricCommitDuration + "_bucket", server.MetricCommittedOpsTotal, server.MetricDeliveriesPushed,
		server.MetricStoreFlushes, server.MetricStoreCommits, server.MetricStoreAppends,
		server.MetricUnloadable, server.MetricReady, server.MetricBuildInfo, server.MetricConversations,
		server.MetricBindings, server.MetricStoreFileBytes, server.MetricStoreBytesInUse, server.MetricDataDirBytes,
	} {
		if !strings.Contains(body, "\n"+name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if !strings.Contains(body, server.MetricConnectionsOpen+`{transport="`+h.transport()+`"} 2`+"\n") {
		t.Errorf("/metrics does not count 2 open connections:\n%s", grep(body, server.MetricConnectionsOpen))
	}
	for _, want := range []string{
		server.MetricBuildInfo + `{goversion="`,
		server.MetricConversations + `{state="loaded"} 1`,
		server.MetricConversations + `{state="known"} 1`,
		server.MetricBindings + " 2\n",
		server.MetricCommittedOpsTotal + " 3\n",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, grep(body, strings.Fields(strings.Split(want, "{")[0])[0]))
		}
	}
	if strings.Contains(body, "ops_per_flush") || strings.Contains(body, "latency_seconds") {
		t.Errorf("/metrics still has a server-computed ratio or a _latency_seconds histogram")
	}
	if size := metricValue(t, body, server.MetricStoreFileBytes); size <= 0 {
		t.Errorf("%s = %v, want the store file's size", server.MetricStoreFileBytes, size)
	}
	if used := metricValue(t, body, server.MetricStoreBytesInUse); used <= 0 {
		t.Errorf("%s = %v, want the bytes the store holds", server.MetricStoreBytesInUse, used)
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
	// Without the admin token: the count, never the ids.
	if got["count"] != float64(0) || got["conversations"] != nil {
		t.Errorf("/unloadable-conversations = %s, want count 0 and no list", body)
	}

	h.shutdown()
	if _, err := http.Get("http://" + h.srv.HealthAddr().String() + "/ready"); err == nil {
		t.Error("health listener still serving after Run returned")
	}
}

// metricValue returns the value of the unlabelled metric name in body.
func metricValue(t *testing.T, body, name string) float64 {
	t.Helper()
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			return f
		}
	}
	t.Fatalf("/metrics has no %s", name)
	return 0
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

func TestHealth_PprofOnlyWhenAsked(t *testing.T) {
	for _, on := range []bool{false, true} {
		h := start(t, server.Config{Pprof: on, AdminToken: "s3cret"})
		code, body := h.do("GET", "/debug/pprof/goroutine?debug=1", "s3cret", "")
		switch {
		case on && (code != http.StatusOK || !strings.Contains(body, "goroutine")):
			t.Errorf("with Pprof, /debug/pprof/goroutine = %d, %.80q", code, body)
		case !on && code != http.StatusNotFound:
			t.Errorf("without Pprof, /debug/pprof/goroutine = %d, want 404", code)
		}
		h.shutdown()
	}
}
