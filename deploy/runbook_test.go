package deploy

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// runbookBase is where every alert's runbook_url points: a section of
// docs/runbooks.md.
const runbookBase = "https://github.com/participantd/participantd/blob/main/docs/runbooks.md#"

// slug is GitHub's anchor of a Markdown heading: lower case, spaces to
// hyphens, punctuation other than hyphens and underscores dropped.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || ('a' <= r && r <= 'z') || ('0' <= r && r <= '9'):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// runbookSections returns docs/runbooks.md's second-level sections by
// anchor, each with its text.
func runbookSections(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("../docs/runbooks.md")
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]string{}
	parts := regexp.MustCompile(`(?m)^## `).Split(string(b), -1)
	for _, p := range parts[1:] {
		heading, body, _ := strings.Cut(p, "\n")
		sections[slug(heading)] = body
	}
	return sections
}

// TestAlerts_RunbookURLs checks that every alert carries a runbook_url
// into docs/runbooks.md whose section exists and says what the alert
// means, how to check and what to do, and that every section is an
// alert's.
func TestAlerts_RunbookURLs(t *testing.T) {
	b, err := os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `json:"alert"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	sections := runbookSections(t)
	used := map[string]bool{}
	alerts := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			url, ok := r.Annotations["runbook_url"]
			if !ok {
				t.Errorf("alert %s has no runbook_url", r.Alert)
				continue
			}
			anchor, ok := strings.CutPrefix(url, runbookBase)
			if !ok {
				t.Errorf("alert %s: runbook_url %q is not under %s", r.Alert, url, runbookBase)
				continue
			}
			body, ok := sections[anchor]
			if !ok {
				t.Errorf("alert %s: runbook_url %q: docs/runbooks.md has no section #%s", r.Alert, url, anchor)
				continue
			}
			if anchor != slug(r.Alert) {
				t.Errorf("alert %s: runbook_url points at #%s, not at its own section #%s", r.Alert, anchor, slug(r.Alert))
			}
			used[anchor] = true
			for _, part := range []string{"**Means**", "**Check**", "**Do**"} {
				if !strings.Contains(body, part) {
					t.Errorf("docs/runbooks.md#%s lacks %s", anchor, part)
				}
			}
		}
	}
	if alerts < 10 {
		t.Fatalf("found only %d alerts: is the rules file's layout what this test expects?", alerts)
	}
	for anchor := range sections {
		if !used[anchor] {
			t.Errorf("docs/runbooks.md#%s is no alert's runbook", anchor)
		}
	}
}
