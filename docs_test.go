package participantd_test

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// hexBlock is one fenced block of docs/clients.md that claims to show the
// bytes of a golden frame: "```hex testdata/wire/NAME.bin".
type hexBlock struct {
	file string // the golden file, relative to the repository root
	line int    // where the block starts in the document
	hex  string // its hex digits, comments and spaces removed
}

func hexBlocks(t *testing.T, doc string) []hexBlock {
	t.Helper()
	f, err := os.Open(doc)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		blocks []hexBlock
		cur    *hexBlock
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.HasPrefix(line, "```hex"):
			cur = &hexBlock{file: strings.TrimSpace(strings.TrimPrefix(line, "```hex")), line: n}
		case cur != nil && strings.HasPrefix(line, "```"):
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			code, _, _ := strings.Cut(line, "#")
			cur.hex += strings.Join(strings.Fields(code), "")
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("%s:%d: hex block never closed", doc, cur.line)
	}
	return blocks
}

// TestClientsDocHexMatchesGoldenFrames keeps the worked example of
// docs/clients.md honest: every hex block is, byte for byte, the golden
// frame it names (the frames package wire's golden tests pin).
func TestClientsDocHexMatchesGoldenFrames(t *testing.T) {
	const doc = "docs/clients.md"
	blocks := hexBlocks(t, doc)
	if len(blocks) < 8 {
		t.Fatalf("%s has %d hex blocks; the worked exchange needs at least 8", doc, len(blocks))
	}
	for _, b := range blocks {
		if !strings.HasPrefix(b.file, "testdata/wire/") {
			t.Errorf("%s:%d: hex block names %q, want a file under testdata/wire/", doc, b.line, b.file)
			continue
		}
		want, err := os.ReadFile(filepath.FromSlash(b.file))
		if err != nil {
			t.Errorf("%s:%d: %v", doc, b.line, err)
			continue
		}
		got, err := hex.DecodeString(b.hex)
		if err != nil {
			t.Errorf("%s:%d: not hex: %v", doc, b.line, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s:%d: the hex differs from %s\n got %x\nwant %x", doc, b.line, b.file, got, want)
		}
	}
}

// TestDocLinksResolve checks that every relative link of the README and of
// docs/ names a file of the repository.
func TestDocLinksResolve(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)#\s]+)(#[^)]*)?\)`)
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range append([]string{"README.md"}, docs...) {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(text), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(doc), filepath.FromSlash(target))); err != nil {
				t.Errorf("%s links to %s: %v", doc, target, err)
			}
		}
	}
}

// TestReadmeGoSnippetIsTheClientExample keeps the README's Go snippet
// compiling: it must be, line for line, the body of client's Example.
func TestReadmeGoSnippetIsTheClientExample(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(readme), "```go\n")
	if !ok {
		t.Fatal("README.md has no ```go block")
	}
	snippet, _, ok := strings.Cut(after, "```\n")
	if !ok {
		t.Fatal("README.md's ```go block never closes")
	}
	src, err := os.ReadFile("client/example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok = strings.Cut(string(src), "\nfunc Example() {\n")
	if !ok {
		t.Fatal("client/example_test.go has no func Example")
	}
	body, _, _ := strings.Cut(after, "\n}\n")
	var lines []string
	for _, l := range strings.Split(body, "\n") {
		lines = append(lines, strings.TrimPrefix(l, "\t"))
	}
	if want := strings.Join(lines, "\n") + "\n"; snippet != want {
		t.Errorf("README.md's Go snippet differs from the body of client.Example:\n%s", cmp.Diff(want, snippet))
	}
}

// TestReadmeIsShort keeps the README a front page: at most 200 lines, with
// the two commands a newcomer starts with near the top, and the detail in
// docs/.
func TestReadmeIsShort(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) > 200 {
		t.Errorf("README.md has %d lines, want at most 200: move detail into docs/", len(lines))
	}
	top := strings.Join(lines[:min(len(lines), 30)], "\n")
	for _, cmd := range []string{"go run ./cmd/participantd", "make test"} {
		if !strings.Contains(top, cmd) {
			t.Errorf("README.md's first 30 lines lack %q", cmd)
		}
	}
}
