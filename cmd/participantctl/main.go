// Command participantctl is the command-line client of participantd and its
// offline tools.
//
// Online subcommands (enroll, attach, tell, tail, ack, leave) talk to a
// running server through package client and keep the participant's
// credential in a file the user names (--creds), rewritten atomically, mode
// 0600, after every attach; a bare name lives in the per-user directory
// (credsdir.go). The auth token comes from --auth-token-file,
// --auth-token or PARTICIPANTCTL_AUTH_TOKEN. Each prints one labelled line
// ("enrolled: ...", "told: ...") on standard output, and a refusal in the
// user's terms (explain.go) on standard error. Offline subcommands
// (inspect, verify) read a stopped server's data directory and never write
// to it.
//
// Each subcommand lives in its own file and registers itself in commands
// from an init function; adding one is adding a file. Its flags are a
// spf13/pflag set (newFlagSet) parsed by cli.ParseFlags: GNU style, so
// flags may come anywhere among the arguments and a long flag takes two
// dashes.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/participantd/participantd/internal/buildinfo"
	"github.com/participantd/participantd/internal/cli"
)

// command is one subcommand.
type command struct {
	name     string
	synopsis string // one line, for the list of subcommands
	// usage is printed by -h: the arguments, then what the command does.
	usage string
	// run parses args (without the subcommand's name) and runs. An
	// *cli.ExitError sets the exit status; any other error exits 1.
	run func(ctx context.Context, e *env, args []string) error
}

// commands holds every subcommand by name; files register theirs in init.
var commands = map[string]*command{}

// moved names the subcommands that became commands of their own, with
// what to run instead: a script written for an earlier release gets one
// line saying where to go, not the list of subcommands. They are not
// listed.
var moved = map[string]string{
	"bench": "participantbench, with the same flags",
}

func register(c *command) {
	if _, dup := commands[c.name]; dup {
		panic("participantctl: subcommand " + c.name + " registered twice")
	}
	commands[c.name] = c
}

// env is what a subcommand may touch of the process, so that tests run
// subcommands in process.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, &env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}, os.Args[1:]))
}

// run runs the subcommand named by args[0] and returns the exit status.
func run(ctx context.Context, e *env, args []string) int {
	if len(args) > 0 && (args[0] == "--version" || args[0] == "-version" || args[0] == "version") {
		fmt.Fprint(e.stdout, buildinfo.Read().String("participantctl"))
		return 0
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		printCommands(e.stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if to, ok := moved[args[0]]; ok {
		fmt.Fprintf(e.stderr, "participantctl: %s is now a command of its own: %s\n", args[0], to)
		return cli.ExitUsage
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "participantctl: unknown subcommand %q\n", args[0])
		printCommands(e.stderr)
		return 2
	}
	err := c.run(ctx, e, args[1:])
	return cli.Status(err, e.stderr, "participantctl "+c.name, "participantctl "+c.name+" -h describes its arguments and flags.")
}

func printCommands(w io.Writer) {
	fmt.Fprintf(w, "usage: participantctl <subcommand> [flags]\n\nsubcommands:\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].synopsis)
	}
	fmt.Fprintf(w, "\nparticipantctl <subcommand> -h describes one; participantctl --version prints the build.\n")
}

// newFlagSet returns the flag set of c, printing c's usage on -h (and only
// then: cli.Parse turns a bad flag into a one-line usage error).
func newFlagSet(e *env, c *command) *pflag.FlagSet {
	fs := pflag.NewFlagSet(c.name, pflag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "usage: participantctl %s %s\n\nflags:\n", c.name, c.usage)
		fs.PrintDefaults()
	}
	return fs
}
