package cli

import (
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
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

// Flags come anywhere, as etcdctl's do: after the positional arguments,
// between them, with "=" or a separate value; "--" ends them.
func TestParse_FlagsAfterPositionalArguments(t *testing.T) {
	for _, c := range []struct {
		args []string
		pos  []string
		tok  string
		js   bool
	}{
		{[]string{"42", "--admin-token", "x"}, []string{"42"}, "x", false},
		{[]string{"--json", "42", "-admin-token=y"}, []string{"42"}, "y", true},
		{[]string{"a", "--json", "b", "--admin-token", "z", "c"}, []string{"a", "b", "c"}, "z", true},
		{[]string{"-", "--json"}, []string{"-"}, "", true},
		{[]string{"x", "--", "--json", "-v"}, []string{"x", "--json", "-v"}, "", false},
		{[]string{"--admin-token", "--json"}, nil, "--json", false},
	} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		tok := fs.String("admin-token", "", "")
		js := fs.Bool("json", false, "")
		if err := Parse(fs, c.args); err != nil {
			t.Errorf("Parse(%q) = %v", c.args, err)
			continue
		}
		if got := fs.Args(); !slices.Equal(got, c.pos) && !(len(got) == 0 && len(c.pos) == 0) {
			t.Errorf("Parse(%q): Args() = %q, want %q", c.args, got, c.pos)
		}
		if *tok != c.tok || *js != c.js {
			t.Errorf("Parse(%q): admin-token %q json %v, want %q %v", c.args, *tok, *js, c.tok, c.js)
		}
	}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Bool("json", false, "")
	var ee *ExitError
	if err := Parse(fs, []string{"42", "--nope"}); !errors.As(err, &ee) || ee.Code != ExitUsage {
		t.Errorf("Parse(42 --nope) = %v, want a usage error for the unknown flag", err)
	}
}

// ParseFlags (pflag): flags come anywhere, with "=" or a separate value,
// "--" ends them; -h and --help print the usage; a bad flag is a usage
// error that prints nothing.
func TestParseFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		pos  []string
		tok  string
		js   bool
	}{
		{[]string{"42", "--admin-token", "x"}, []string{"42"}, "x", false},
		{[]string{"--json", "42", "--admin-token=y"}, []string{"42"}, "y", true},
		{[]string{"a", "--json", "b", "--admin-token", "z", "c"}, []string{"a", "b", "c"}, "z", true},
		{[]string{"-", "--json"}, []string{"-"}, "", true},
		{[]string{"x", "--", "--json", "-v"}, []string{"x", "--json", "-v"}, "", false},
		{[]string{"--admin-token", "--json"}, nil, "--json", false},
	} {
		fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
		tok := fs.String("admin-token", "", "")
		js := fs.Bool("json", false, "")
		if err := ParseFlags(fs, c.args); err != nil {
			t.Errorf("ParseFlags(%q) = %v", c.args, err)
			continue
		}
		if got := fs.Args(); !slices.Equal(got, c.pos) && !(len(got) == 0 && len(c.pos) == 0) {
			t.Errorf("ParseFlags(%q): Args() = %q, want %q", c.args, got, c.pos)
		}
		if *tok != c.tok || *js != c.js {
			t.Errorf("ParseFlags(%q): admin-token %q json %v, want %q %v", c.args, *tok, *js, c.tok, c.js)
		}
	}

	var out strings.Builder
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	fs.SetOutput(&out)
	fs.Usage = func() { fmt.Fprintln(fs.Output(), "usage") }
	fs.Bool("json", false, "")
	var ee *ExitError
	if err := ParseFlags(fs, []string{"42", "--nope"}); !errors.As(err, &ee) || ee.Code != ExitUsage || out.Len() != 0 {
		t.Errorf("ParseFlags(42 --nope) = %v, printed %q; want a usage error and nothing printed", err, out.String())
	}
	for _, h := range []string{"-h", "--help"} {
		out.Reset()
		if err := ParseFlags(fs, []string{h}); !errors.Is(err, pflag.ErrHelp) || out.String() != "usage\n" {
			t.Errorf("ParseFlags(%s) = %v, printed %q; want pflag.ErrHelp and the usage", h, err, out.String())
		}
	}
	if code := Status(fmt.Errorf("wrapped: %w", pflag.ErrHelp), &out, "prog", "hint"); code != 0 {
		t.Errorf("Status(pflag.ErrHelp) = %d, want 0", code)
	}
}

// A long flag given with one dash, as the standard flag package took it
// (-json, -admin-token=x), is a usage error that names the two-dash form,
// not pflag's "unknown shorthand flag: 'j' in -json".
func TestParseFlags_OneDashLongFlagNamesTwoDashes(t *testing.T) {
	for _, arg := range []string{"-json", "-admin-token=x", "-admin-token"} {
		fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
		fs.String("admin-token", "", "")
		fs.Bool("json", false, "")
		name := strings.SplitN(strings.TrimPrefix(arg, "-"), "=", 2)[0]
		err := ParseFlags(fs, []string{"42", arg})
		var ee *ExitError
		if !errors.As(err, &ee) || ee.Code != ExitUsage || !strings.Contains(err.Error(), "--"+name) || strings.Contains(err.Error(), "shorthand") {
			t.Errorf("ParseFlags(42 %s) = %v, want a usage error naming --%s", arg, err, name)
		}
	}
}
