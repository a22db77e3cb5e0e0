package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"

	"github.com/spf13/pflag"

	"github.com/participantd/participantd/internal/cli"
)

func init() {
	register(&command{
		name:     "completion",
		synopsis: "print a shell completion script (bash, zsh or fish)",
		usage: `bash|zsh|fish

Prints a script that completes participantctl's subcommands and their
flags. Load it from your shell's start-up file:

  bash:  source <(participantctl completion bash)      (in ~/.bashrc)
  zsh:   source <(participantctl completion zsh)       (in ~/.zshrc, after compinit)
  fish:  participantctl completion fish > ~/.config/fish/completions/participantctl.fish`,
		run: runCompletion,
	})
}

func runCompletion(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, commands["completion"])
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("want exactly one shell: bash, zsh or fish")}
	}
	spec, err := readCompletionSpec(ctx)
	if err != nil {
		return err
	}
	switch fs.Arg(0) {
	case "bash":
		return writeBash(e.stdout, spec)
	case "zsh":
		return writeZsh(e.stdout, spec)
	case "fish":
		return writeFish(e.stdout, spec)
	}
	return &cli.ExitError{Code: cli.ExitUsage, Err: fmt.Errorf("unknown shell %q: want bash, zsh or fish", fs.Arg(0))}
}

// completionSpec is every subcommand and its flags (without dashes), both
// sorted.
type completionSpec struct {
	names []string
	flags map[string][]string
	help  map[string]string // synopsis, for zsh and fish
}

// flagLine matches the first line of a flag in pflag's PrintDefaults.
var flagLine = regexp.MustCompile(`^ +(?:-[A-Za-z0-9], )?--([A-Za-z0-9][A-Za-z0-9-]*)`)

// readCompletionSpec reads each subcommand's flags from its own -h output,
// so that a flag added to a subcommand is completed without being listed
// here.
func readCompletionSpec(ctx context.Context) (completionSpec, error) {
	spec := completionSpec{flags: make(map[string][]string), help: make(map[string]string)}
	for name, c := range commands {
		spec.names = append(spec.names, name)
		spec.help[name] = c.synopsis
		var usage bytes.Buffer
		e := &env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: &usage, getenv: func(string) string { return "" }}
		if err := c.run(ctx, e, []string{"-h"}); err != nil && !isHelp(err) {
			return spec, fmt.Errorf("%s -h: %w", name, err)
		}
		for _, l := range strings.Split(usage.String(), "\n") {
			if m := flagLine.FindStringSubmatch(l); m != nil {
				spec.flags[name] = append(spec.flags[name], m[1])
			}
		}
		sort.Strings(spec.flags[name])
	}
	sort.Strings(spec.names)
	return spec, nil
}

func isHelp(err error) bool { return errors.Is(err, pflag.ErrHelp) }

func writeBash(w io.Writer, spec completionSpec) error {
	var b strings.Builder
	b.WriteString(`# bash completion for participantctl; load with: source <(participantctl completion bash)
_participantctl() {
    local cur=${COMP_WORDS[COMP_CWORD]}
    if [[ $COMP_CWORD -eq 1 ]]; then
        COMPREPLY=($(compgen -W "`)
	b.WriteString(strings.Join(spec.names, " ") + " --help --version")
	b.WriteString(`" -- "$cur"))
        return
    fi
    local flags
    case ${COMP_WORDS[1]} in
`)
	for _, n := range spec.names {
		fmt.Fprintf(&b, "    %s) flags=%q ;;\n", n, dashed(spec.flags[n]))
	}
	b.WriteString(`    *) return ;;
    esac
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$flags" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}
complete -o default -F _participantctl participantctl
`)
	_, err := io.WriteString(w, b.String())
	return err
}

func writeZsh(w io.Writer, spec completionSpec) error {
	var b strings.Builder
	b.WriteString(`#compdef participantctl
# zsh completion for participantctl; load with: source <(participantctl completion zsh)
_participantctl() {
    local -a subcommands
    subcommands=(
`)
	for _, n := range spec.names {
		fmt.Fprintf(&b, "        %q\n", n+":"+strings.ReplaceAll(spec.help[n], ":", `\:`))
	}
	b.WriteString(`    )
    if (( CURRENT == 2 )); then
        _describe -t commands 'participantctl subcommand' subcommands
        return
    fi
    local -a flags
    case $words[2] in
`)
	for _, n := range spec.names {
		fmt.Fprintf(&b, "        %s) flags=(%s) ;;\n", n, dashed(spec.flags[n]))
	}
	b.WriteString(`        *) return ;;
    esac
    _arguments -s '*:file:_files' "${flags[@]/%/[]}"
}
compdef _participantctl participantctl
`)
	_, err := io.WriteString(w, b.String())
	return err
}

func writeFish(w io.Writer, spec completionSpec) error {
	var b strings.Builder
	b.WriteString(`# fish completion for participantctl; install with:
#   participantctl completion fish > ~/.config/fish/completions/participantctl.fish
complete -c participantctl -n __fish_use_subcommand -l help -d 'print the usage'
complete -c participantctl -n __fish_use_subcommand -l version -d 'print the version'
`)
	for _, n := range spec.names {
		fmt.Fprintf(&b, "complete -c participantctl -f -n __fish_use_subcommand -a %s -d %s\n", n, fishQuote(spec.help[n]))
	}
	for _, n := range spec.names {
		for _, f := range spec.flags[n] {
			fmt.Fprintf(&b, "complete -c participantctl -n '__fish_seen_subcommand_from %s' -l %s\n", n, f)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// fishQuote quotes s for fish: in single quotes, only \ and ' are special.
func fishQuote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// dashed returns the flags as "--a --b".
func dashed(flags []string) string {
	out := make([]string, len(flags))
	for i, f := range flags {
		out[i] = "--" + f
	}
	return strings.Join(out, " ")
}
