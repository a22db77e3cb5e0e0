// Package cli is the command-line plumbing the project's commands share
// (cmd/participantctl and cmd/participantbench): an error that carries an
// exit status (ExitError), flag parsing that turns a bad flag into a
// one-line usage error instead of the whole help (ParseFlags over
// spf13/pflag, participantctl's; Parse over the standard flag package),
// and the mapping of a command's error to what it prints and its exit
// status (Status). It imports nothing of the project.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"
)

// ExitError ends the process with Code after printing Err, if any.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

func (e *ExitError) Unwrap() error { return e.Err }

// ExitUsage is the exit status of a usage error: Status prints the error
// and one line pointing at -h, never the whole help.
const ExitUsage = 2

// Parse parses args into fs. On -h it prints fs's usage and returns
// flag.ErrHelp; a parse failure is a usage error (an *ExitError with
// ExitUsage) carrying the flag package's reason, which Status prints with a
// pointer to -h. The flag package would print the reason and then the
// whole usage: Parse silences it while it runs.
//
// Flags may come anywhere among the arguments, before or after the
// positional ones, as etcdctl's and kubectl's do: `status 42 --json` is
// `status --json 42`. A "--" ends the flags; what follows is positional
// even if it starts with "-". fs.Args() returns the positional arguments
// in their order.
func Parse(fs *flag.FlagSet, args []string) error {
	usage, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	err := fs.Parse(interspersed(fs, args))
	fs.Usage = usage
	fs.SetOutput(out)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		usage()
		return err
	}
	return &ExitError{Code: ExitUsage, Err: err}
}

// ParseFlags parses args into fs, a pflag (GNU-style) flag set: flags
// may come anywhere among the arguments (--flag value, --flag=value, a
// "--" ending them), as etcdctl's and kubectl's do. On -h or --help it
// prints fs's usage and returns pflag.ErrHelp; a parse failure is a usage
// error (an *ExitError with ExitUsage) carrying pflag's reason, which
// Status prints with a pointer to -h, never the whole usage: ParseFlags
// silences fs's own printing while it runs.
func ParseFlags(fs *pflag.FlagSet, args []string) error {
	usage, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	fs.SetInterspersed(true)
	err := fs.Parse(args)
	fs.Usage = usage
	fs.SetOutput(out)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pflag.ErrHelp):
		usage()
		return err
	}
	return &ExitError{Code: ExitUsage, Err: oneDash(fs, err)}
}

// oneDash turns pflag's error for a long flag given with one dash, as the
// standard flag package took it ("unknown shorthand flag: 'j' in -json"),
// into one naming the two-dash form; any other error is returned as is.
func oneDash(fs *pflag.FlagSet, err error) error {
	const marker = " in -"
	msg := err.Error()
	i := strings.LastIndex(msg, marker)
	if !strings.HasPrefix(msg, "unknown shorthand flag") || i < 0 {
		return err
	}
	name, _, _ := strings.Cut(msg[i+len(marker):], "=")
	if len(name) < 2 || fs.Lookup(name) == nil {
		return err
	}
	return fmt.Errorf("-%s: a long flag takes two dashes: --%s", name, name)
}

// interspersed returns args with the flags first and the positional
// arguments after a "--", so that the flag package, which stops at the
// first positional argument, sees every flag. A flag takes the next
// argument as its value unless it is a boolean flag or carries its value
// after "=". "-" alone (standard input) is positional.
func interspersed(fs *flag.FlagSet, args []string) []string {
	var flags, positional []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			positional = append(positional, args[i+1:]...)
			i = len(args)
		case len(a) < 2 || a[0] != '-':
			positional = append(positional, a)
		default:
			flags = append(flags, a)
			name := strings.TrimLeft(a, "-")
			if strings.Contains(name, "=") {
				continue
			}
			f := fs.Lookup(name)
			if f == nil {
				continue // unknown: the flag package reports it
			}
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
				continue
			}
			if i+1 < len(args) {
				i++
				flags = append(flags, args[i])
			}
		}
	}
	if len(positional) == 0 {
		return flags
	}
	return append(append(flags, "--"), positional...)
}

// Status returns the exit status of a command that ended with err, after
// printing to stderr what the user should see. nil, flag.ErrHelp and
// pflag.ErrHelp (the usage is already printed) are 0. An *ExitError is its Code, after the
// line "<prog>: <Err>" if Err is set, and for ExitUsage the line hint (the
// pointer to -h). Any other error is 1, after "<prog>: <err>".
func Status(err error, stderr io.Writer, prog, hint string) int {
	var ee *ExitError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp), errors.Is(err, pflag.ErrHelp):
		return 0
	case errors.As(err, &ee):
		if ee.Err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", prog, ee.Err)
		}
		if ee.Code == ExitUsage {
			fmt.Fprintln(stderr, hint)
		}
		return ee.Code
	default:
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return 1
	}
}
