package deploy

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// selector matches a participantd series selector in a PromQL expression:
// the metric name and its label matchers, if any.
var selector = regexp.MustCompile(`\b(participantd_[a-z0-9_]+)\b(\{[^}]*\})?`)

// matcher matches one label matcher of a selector.
var matcher = regexp.MustCompile(`([a-z_]+)\s*(=~|!~|!=|=)\s*"([^"]*)"`)

// literalAlternatives matches a regular expression that is only literal
// label values separated by |.
var literalAlternatives = regexp.MustCompile(`^[a-z0-9_]+(\|[a-z0-9_]+)*$`)

// want is a series the dashboard or an alert reads: a metric and, where a
// matcher names a label's values, one of those values.
type want struct {
	metric, label, value string
	file                 string
}

// referencedSeries reads every selector of the dashboard and the alert
// rules and returns, for each, the series it needs: the metric itself,
// and one series per literal value an = or =~ matcher names (job and
// instance, which are Prometheus's, aside).
func referencedSeries(t *testing.T) []want {
	t.Helper()
	var wants []want
	for _, f := range []string{"grafana/participantd.json", "prometheus/alerts.yml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range selector.FindAllStringSubmatch(string(b), -1) {
			wants = append(wants, want{metric: m[1], file: f})
			for _, lm := range matcher.FindAllStringSubmatch(m[2], -1) {
				label, op, val := lm[1], lm[2], lm[3]
				if label == "job" || label == "instance" || (op != "=" && op != "=~") {
					continue
				}
				if op == "=~" && !literalAlternatives.MatchString(val) {
					t.Fatalf("%s: %s{%s=~%q}: only literal alternatives can be checked", f, m[1], label, val)
				}
				for _, v := range strings.Split(val, "|") {
					wants = append(wants, want{metric: m[1], label: label, value: v, file: f})
				}
			}
		}
	}
	if len(wants) < 40 {
		t.Fatalf("found only %d series in the dashboard and rules: is the pattern wrong?", len(wants))
	}
	return wants
}

// present reports whether the exposition body holds a sample of w.
func present(body string, w want) bool {
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, rest, _ := strings.Cut(line, "{")
		if i := strings.IndexByte(name, ' '); i >= 0 {
			name, rest = name[:i], ""
		}
		if name != w.metric {
			continue
		}
		if w.label == "" || strings.Contains(rest, w.label+`="`+w.value+`"`) {
			return true
		}
	}
	return false
}

// TestMonitoring_SeriesPresentAtStart scrapes a single node and a cluster
// node that have served nothing and checks that every series a dashboard
// panel or an alert reads is already there (at 0), so that no panel
// starts empty and no rate() misses the first increase. On a single node
// the cluster series (participantd_cluster_*) are absent, which is what
// lets ParticipantdLeaseLost stay quiet there; the dashboard's panels of
// them must sit in its "Cluster mode" row and say so when empty.
func TestMonitoring_SeriesPresentAtStart(t *testing.T) {
	wants := referencedSeries(t)
	single := get(t, run(t, server.Config{AdminToken: "admin-secret", CheckpointInterval: time.Hour}), "/metrics")

	etcd, err := etcdtest.Start(t.TempDir(), etcdtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(etcd.Close)
	clustered := get(t, run(t, server.Config{Cluster: server.ClusterConfig{Endpoints: etcd.Endpoints(), NodeID: "a", Prefix: "/pd/", LeaseTTL: 2 * time.Second}}), "/metrics")

	for _, node := range []struct{ name, body string }{{"single node", single}, {"cluster node", clustered}} {
		seen := map[want]bool{}
		for _, w := range wants {
			key := want{metric: w.metric, label: w.label, value: w.value}
			if seen[key] {
				continue
			}
			seen[key] = true
			if node.name == "single node" && strings.HasPrefix(w.metric, "participantd_cluster_") {
				if present(node.body, w) {
					t.Errorf("single node exports %s: a cluster series, which the dashboard and ParticipantdLeaseLost take for a cluster node", w.metric)
				}
				continue
			}
			if !present(node.body, w) {
				if w.label != "" {
					t.Errorf("%s at start: no %s{%s=%q} (read by %s)", node.name, w.metric, w.label, w.value, w.file)
				} else {
					t.Errorf("%s at start: no %s (read by %s)", node.name, w.metric, w.file)
				}
			}
		}
	}
}

// TestDashboard_ClusterPanelsSayWhyEmpty checks that every panel reading
// a cluster series sits in the "Cluster mode" row and sets a noValue text,
// so that on a single node it says why it is empty instead of "No data".
func TestDashboard_ClusterPanelsSayWhyEmpty(t *testing.T) {
	b, err := os.ReadFile("grafana/participantd.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Type, Title string
			FieldConfig struct {
				Defaults struct {
					NoValue string `json:"noValue"`
				} `json:"defaults"`
			} `json:"fieldConfig"`
			Targets []struct{ Expr string } `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	row, clusterPanels := "", 0
	for _, p := range d.Panels {
		if p.Type == "row" {
			row = p.Title
			continue
		}
		cluster := false
		for _, tg := range p.Targets {
			if strings.Contains(tg.Expr, "participantd_cluster_") {
				cluster = true
			}
		}
		if !cluster {
			continue
		}
		clusterPanels++
		if row != "Cluster mode" {
			t.Errorf("panel %q reads cluster series but sits in row %q", p.Title, row)
		}
		if !strings.Contains(p.FieldConfig.Defaults.NoValue, "single node") {
			t.Errorf("panel %q: noValue %q does not say that a single node has no cluster series", p.Title, p.FieldConfig.Defaults.NoValue)
		}
	}
	if clusterPanels == 0 {
		t.Fatal("no panel reads a cluster series: is the dashboard's layout what this test expects?")
	}
}
