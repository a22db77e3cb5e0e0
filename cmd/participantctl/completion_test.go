package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestCompletion_ScriptsListEverySubcommandAndFlag(t *testing.T) {
	ctx := testCtx(t)
	spec, err := readCompletionSpec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(spec.names) != len(commands) {
		t.Fatalf("spec has %d subcommands, participantctl %d", len(spec.names), len(commands))
	}
	if f := spec.flags["tail"]; !strings.Contains(strings.Join(f, " "), "follow-takeover") {
		t.Errorf("tail's flags = %v, want follow-takeover among them", f)
	}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		script := mustCtl(t, ctx, "completion", shell)
		for name := range commands {
			if !strings.Contains(script, name) {
				t.Errorf("the %s script lacks subcommand %s", shell, name)
			}
			for _, f := range spec.flags[name] {
				spelled := "--" + f
				if shell == "fish" {
					spelled = "from " + name + "' -l " + f + "\n"
				}
				if !strings.Contains(script, spelled) {
					t.Errorf("the %s script lacks %s's flag --%s", shell, name, f)
				}
			}
		}
	}
	if _, errs, code := ctl(ctx, "", "completion", "tcsh"); code != 2 || !strings.Contains(errs, "bash, zsh or fish") {
		t.Errorf("completion tcsh = %d, %q; want a usage error", code, errs)
	}
}

// complete runs the bash script's completion function on words and returns
// COMPREPLY.
func complete(t *testing.T, script string, words ...string) []string {
	t.Helper()
	quoted := make([]string, len(words))
	for i, w := range words {
		quoted[i] = "'" + w + "'"
	}
	prog := "source " + script + "\nCOMP_WORDS=(" + strings.Join(quoted, " ") + ")\nCOMP_CWORD=" +
		itoa(uint64(len(words)-1)) + "\n_participantctl\necho \"${COMPREPLY[*]}\"\n"
	out, err := exec.Command("bash", "-c", prog).CombinedOutput()
	if err != nil {
		t.Fatalf("bash: %v: %s", err, out)
	}
	return strings.Fields(string(out))
}

func TestCompletion_BashCompletes(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	script := filepath.Join(t.TempDir(), "participantctl.bash")
	if err := os.WriteFile(script, []byte(mustCtl(t, context.Background(), "completion", "bash")), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		words []string
		want  string
	}{
		{[]string{"participantctl", "ta"}, "tail"},
		{[]string{"participantctl", "te"}, "tell"},
		{[]string{"participantctl", "tail", "--fol"}, "--follow-takeover"},
		{[]string{"participantctl", "ack", "--thr"}, "--through"},
		{[]string{"participantctl", "inspect", "--js"}, "--json"},
	} {
		got := complete(t, script, c.words...)
		if len(got) != 1 || got[0] != c.want {
			t.Errorf("completing %q = %q, want %q", c.words, got, c.want)
		}
	}
}

func TestCompletion_ZshScriptParses(t *testing.T) {
	if _, err := exec.LookPath("zsh"); err != nil {
		t.Skip("no zsh")
	}
	script := filepath.Join(t.TempDir(), "_participantctl")
	if err := os.WriteFile(script, []byte(mustCtl(t, context.Background(), "completion", "zsh")), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("zsh", "-n", script).CombinedOutput(); err != nil {
		t.Errorf("zsh -n: %v: %s", err, out)
	}
	// Loaded in an interactive-like zsh with compinit, it defines the function.
	prog := "autoload -Uz compinit && compinit -u -d " + filepath.Join(t.TempDir(), "zcompdump") + " && source " + script + " && whence -w _participantctl"
	if out, err := exec.Command("zsh", "-f", "-c", prog).CombinedOutput(); err != nil || !strings.Contains(string(out), "function") {
		t.Errorf("zsh could not load the script: %v: %s", err, out)
	}
}

func TestCompletion_FishCompletes(t *testing.T) {
	if _, err := exec.LookPath("fish"); err != nil {
		t.Skip("no fish (.ci/run installs it)")
	}
	script := filepath.Join(t.TempDir(), "participantctl.fish")
	if err := os.WriteFile(script, []byte(mustCtl(t, context.Background(), "completion", "fish")), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("fish", "--no-execute", script).CombinedOutput(); err != nil {
		t.Fatalf("fish --no-execute: %v: %s", err, out)
	}
	for _, c := range []struct {
		line string
		want string
	}{
		{"participantctl ta", "tail"},
		{"participantctl te", "tell"},
		{"participantctl tail --fol", "--follow-takeover"},
		{"participantctl ack --thr", "--through"},
		{"participantctl inspect --js", "--json"},
	} {
		out, err := exec.Command("fish", "--no-config", "-c", "source "+script+"; complete -C '"+c.line+"'").CombinedOutput()
		if err != nil {
			t.Fatalf("fish: %v: %s", err, out)
		}
		var got []string
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if f := strings.Fields(l); len(f) > 0 {
				got = append(got, f[0])
			}
		}
		if len(got) != 1 || got[0] != c.want {
			t.Errorf("completing %q = %q, want %q", c.line, got, c.want)
		}
	}
}
