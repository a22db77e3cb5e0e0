package cli

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"
)

func TestStatus(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		code int
		out  string
	}{
		{"nil", nil, 0, ""},
		{"help", fmt.Errorf("wrapped: %w", flag.ErrHelp), 0, ""},
		{"usage", &ExitError{Code: ExitUsage, Err: errors.New("bad")}, 2, "prog: bad\nprog -h hint\n"},
		{"wrapped exit", fmt.Errorf("ctx: %w", &ExitError{Code: 3, Err: errors.New("gone")}), 3, "prog: gone\n"},
		{"bare exit", &ExitError{Code: 4}, 4, ""},
		{"other", errors.New("boom"), 1, "prog: boom\n"},
	} {
		var b strings.Builder
		if code := Status(c.err, &b, "prog", "prog -h hint"); code != c.code || b.String() != c.out {
			t.Errorf("%s: Status = %d, %q; want %d, %q", c.name, code, b.String(), c.code, c.out)
		}
	}
}

func TestParse(t *testing.T) {
	var out strings.Builder
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(&out)
	fs.Usage = func() { fmt.Fprintln(fs.Output(), "usage") }
	fs.Bool("v", false, "")

	if err := Parse(fs, []string{"-v"}); err != nil {
		t.Fatalf("Parse(-v) = %v", err)
	}
	err := Parse(fs, []string{"-nope"})
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Code != ExitUsage || out.Len() != 0 {
		t.Errorf("Parse(-nope) = %v, printed %q; want a usage ExitError and nothing printed", err, out.String())
	}
	if err := Parse(fs, []string{"-h"}); !errors.Is(err, flag.ErrHelp) || out.String() != "usage\n" {
		t.Errorf("Parse(-h) = %v, printed %q; want flag.ErrHelp and the usage", err, out.String())
	}
	if (&ExitError{Code: 5}).Error() != "exit status 5" {
		t.Errorf("ExitError without Err = %q", (&ExitError{Code: 5}).Error())
	}
}
