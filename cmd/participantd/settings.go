package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/cmd/participantd/server"
	"github.com/participantd/participantd/participant"
)

// EnvPrefix starts every environment variable participantd reads.
const EnvPrefix = "PARTICIPANTD_"

// setting is one configuration key: a flag --name, an environment variable
// PARTICIPANTD_NAME (upper case, '-' as '_') and a config file key name.
type setting struct {
	name  string
	def   string
	help  string
	apply func(o *options, v string) error
}

// options is the resolved configuration.
type options struct {
	server   server.Config
	logLevel zerolog.Level
}

func envName(name string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// configKey names the --config setting, which only flags and the
// environment can give.
const configKey = "config"

var settings = []setting{
	{"data", server.DefaultDataDir, "data directory (store file " + server.StoreFile + ", its log wal/, and node.key); created 0700 if absent",
		func(o *options, v string) error { o.server.DataDir = v; return nonEmpty(v) }},
	{"listen", server.DefaultListen, "wire protocol listen address",
		func(o *options, v string) error { o.server.Listen = v; return nonEmpty(v) }},
	{"health-listen", server.DefaultHealthListen, "health/metrics HTTP listen address",
		func(o *options, v string) error { o.server.HealthListen = v; return nonEmpty(v) }},
	{"auth-token", "", "shared token every hello must carry in auth (empty: no auth)",
		func(o *options, v string) error { o.server.AuthToken = v; return nil }},
	{"tls-cert", "", "PEM certificate: serve the wire listener over TLS (with tls-key)",
		func(o *options, v string) error { o.server.TLSCert = v; return nil }},
	{"tls-key", "", "PEM private key of tls-cert",
		func(o *options, v string) error { o.server.TLSKey = v; return nil }},
	{"max-frame", strconv.Itoa(1 << 20), "largest frame body accepted, bytes (announced in welcome)",
		intSetting(func(o *options) *int { return &o.server.MaxFrame })},
	{"max-record-bytes", strconv.Itoa(512 << 10), "largest tell payload, bytes",
		intSetting(func(o *options) *int { return &o.server.MaxRecordBytes })},
	{"receipt-ttl", "24h", "how long enroll/attach answers replay their secret",
		durationSetting(func(o *options) *time.Duration { return &o.server.ReceiptTTL })},
	{"drain-timeout", server.DefaultDrainTimeout.String(), "how long the drain on SIGTERM/SIGINT may take",
		durationSetting(func(o *options) *time.Duration { return &o.server.DrainTimeout })},
	{"hello-timeout", server.DefaultHelloTimeout.String(), "how long a new connection may take to send hello",
		durationSetting(func(o *options) *time.Duration { return &o.server.HelloTimeout })},
	{"write-timeout", server.DefaultWriteTimeout.String(), "close a connection that accepts no bytes for this long while frames wait",
		durationSetting(func(o *options) *time.Duration { return &o.server.WriteTimeout })},
	{"max-connections", strconv.Itoa(server.DefaultMaxConnections), "open connections; one more is rejected overloaded",
		intSetting(func(o *options) *int { return &o.server.MaxConnections })},
	{"max-pending", strconv.Itoa(server.DefaultMaxPending), "requests of one connection queued or running before reading pauses",
		intSetting(func(o *options) *int { return &o.server.MaxPending })},
	{"max-participants", strconv.Itoa(participant.DefaultMaxParticipants), "participants per conversation (capacity_exceeded past it)",
		intSetting(func(o *options) *int { return &o.server.MaxParticipants })},
	{"max-conversations-per-connection", strconv.Itoa(participant.DefaultMaxConversationsPerConn), "bindings one connection may hold (capacity_exceeded past it)",
		intSetting(func(o *options) *int { return &o.server.MaxConversationsPerConn })},
	{"log-level", "info", "debug, info, warn or error",
		func(o *options, v string) error {
			l, err := zerolog.ParseLevel(v)
			if err != nil || v == "" {
				return fmt.Errorf("want debug, info, warn or error")
			}
			o.logLevel = l
			return nil
		}},
}

func nonEmpty(v string) error {
	if v == "" {
		return errors.New("must not be empty")
	}
	return nil
}

func intSetting(field func(*options) *int) func(*options, string) error {
	return func(o *options, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return errors.New("want a positive integer")
		}
		*field(o) = n
		return nil
	}
}

func durationSetting(field func(*options) *time.Duration) func(*options, string) error {
	return func(o *options, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return errors.New("want a positive duration such as 10s or 24h")
		}
		*field(o) = d
		return nil
	}
}

// errHelp is returned by parseOptions for --help, after printing usage.
var errHelp = flag.ErrHelp

// rawValue is a flag that records its string; values are checked later,
// whatever their source, so that every error names its key.
type rawValue struct{ v *string }

func (r rawValue) String() string {
	if r.v == nil {
		return ""
	}
	return *r.v
}

func (r rawValue) Set(s string) error { *r.v = s; return nil }

// parseOptions resolves every setting: flag, then environment, then the
// config file, then the default. Unknown flags, unknown PARTICIPANTD_
// variables, unknown config file keys and invalid values are errors that
// name the key and where it came from.
func parseOptions(args, environ []string, usageOut io.Writer) (options, error) {
	fs := flag.NewFlagSet("participantd", flag.ContinueOnError)
	fs.SetOutput(usageOut)
	flags := make(map[string]*string)
	for _, s := range append([]setting{{name: configKey}}, settings...) {
		v := new(string)
		flags[s.name] = v
		fs.Var(rawValue{v}, s.name, s.help)
	}
	fs.Usage = func() { usage(usageOut) }
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	given := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })

	known := map[string]bool{envName(configKey): true}
	for _, s := range settings {
		known[envName(s.name)] = true
	}
	env := make(map[string]string)
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(k, EnvPrefix) {
			continue
		}
		if !known[k] {
			return options{}, fmt.Errorf("unknown environment variable %s", k)
		}
		env[k] = v
	}

	var file map[string]string
	path, pathFrom := "", ""
	if given[configKey] {
		path, pathFrom = *flags[configKey], "--"+configKey
	} else if v, ok := env[envName(configKey)]; ok {
		path, pathFrom = v, envName(configKey)
	}
	if pathFrom != "" {
		var err error
		if file, err = readConfigFile(path); err != nil {
			return options{}, fmt.Errorf("%s: %w", pathFrom, err)
		}
	}

	var o options
	for _, s := range settings {
		v, from := s.def, "default"
		if given[s.name] {
			v, from = *flags[s.name], "--"+s.name
		} else if ev, ok := env[envName(s.name)]; ok {
			v, from = ev, envName(s.name)
		} else if fv, ok := file[s.name]; ok {
			v, from = fv, path+": "+s.name
		}
		if err := s.apply(&o, v); err != nil {
			shown := strconv.Quote(v)
			if s.name == "auth-token" {
				shown = "(hidden)"
			}
			return options{}, fmt.Errorf("invalid %s %s (from %s): %w", s.name, shown, from, err)
		}
	}
	return o, nil
}

// readConfigFile reads a config file: one "key = value" per line, keys as
// the flag names without dashes in front, '#' starting a comment line,
// blank lines ignored; the value is the rest of the line, trimmed. Unknown
// and repeated keys are errors naming the line.
func readConfigFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	known := make(map[string]bool)
	for _, s := range settings {
		known[s.name] = true
	}
	out := make(map[string]string)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch {
		case !ok:
			return nil, fmt.Errorf("%s:%d: want key = value", path, n)
		case !known[k]:
			return nil, fmt.Errorf("%s:%d: unknown key %q", path, n, k)
		case out[k] != "":
			return nil, fmt.Errorf("%s:%d: key %q given twice", path, n, k)
		}
		out[k] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

func usage(w io.Writer) {
	fmt.Fprintf(w, `Usage: participantd [flags]

participantd serves the participantd wire protocol (PROTOCOL.md) on an
embedded log-first store (a write-ahead log checkpointed into bbolt). With
no flags it uses ./data and listens on loopback.

Every setting is a flag, an environment variable and a config file key.
Precedence: flag > environment > config file (--config) > default.
The config file holds "key = value" lines ('#' comments); keys are the flag
names. Unknown PARTICIPANTD_* variables, unknown file keys and invalid
values are start-up errors.

  --config FILE
        config file (env %s)
`, envName(configKey))
	for _, s := range settings {
		def := ""
		if s.def != "" {
			def = fmt.Sprintf(" (default %s)", s.def)
		}
		fmt.Fprintf(w, "  --%s\n        %s%s\n        env %s, config key %s\n", s.name, s.help, def, envName(s.name), s.name)
	}
	fmt.Fprint(w, `
Endpoints on --health-listen: GET /health, /ready, /metrics,
/unloadable-conversations.
Signals: SIGTERM or SIGINT drains (exit 0 within --drain-timeout); a second
one exits at once with status 2.
`)
}
