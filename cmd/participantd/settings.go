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

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/store/etcdstore"
	"github.com/participantd/participantd/wire"
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
	server    server.Config
	logLevel  zerolog.Level
	logFormat string // "json", "console" or "auto"
	// heapGoal is heapGoalMedian or heapGoalRuntime (--heap-goal).
	heapGoal string
	// otlpEndpoint is the OTLP/gRPC collector that spans go to; empty
	// traces nothing (tracing.go).
	otlpEndpoint string

	// effective lists every setting's value and where it came from, in
	// the order of settings, for the start-up log line.
	effective []effectiveSetting
	// warnings are logged once the logger exists: settings that work but
	// expose something (a secret on the command line).
	warnings []string
	// secretFiles are the secrets given as files (auth-token-file, ...),
	// read by readSecretFiles once every setting is resolved.
	secretFiles []secretFile

	// allowOpenAdmission lets a listener beyond loopback admit anyone
	// (checkOpenAdmission).
	allowOpenAdmission bool

	// Flag-only modes, not settings.
	version       bool // --version: print the build and exit
	healthcheck   bool // --healthcheck: probe /ready of a running server and exit
	generateToken bool // --generate-token: print a new random token and exit
}

// effectiveSetting is one resolved setting.
type effectiveSetting struct {
	name, value, from string
}

// secretSetting says whether a setting's value must never be logged: one
// whose last word is token, password or secret (auth-token,
// etcd-password; not token-window, nor a -file naming where one is).
func secretSetting(name string) bool {
	// The last word names what the setting holds: auth-token holds a
	// token, token-window a duration.
	switch name[strings.LastIndexByte(name, '-')+1:] {
	case "token", "password", "secret":
		return true
	}
	return false
}

func envName(name string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// configKey names the --config setting, which only flags and the
// environment can give.
const configKey = "config"

// The values of --heap-goal.
const (
	heapGoalMedian  = "median"
	heapGoalRuntime = "runtime"
)

var settings = []setting{
	{"data", server.DefaultDataDir, "data directory (store file " + server.StoreFile + ", its log wal/, and node.key); created 0700 if absent",
		func(o *options, v string) error { o.server.DataDir = v; return nonEmpty(v) }},
	{"store", server.EngineLog, "single-node store engine: log (a write-ahead log, one fdatasync per group commit, checkpointed into the bbolt file) or bbolt (each group commit a bbolt transaction)",
		func(o *options, v string) error {
			if v != server.EngineBolt && v != server.EngineLog {
				return errors.New("want bbolt or log")
			}
			o.server.Engine = v
			return nil
		}},
	{"listen", server.DefaultListen, "wire protocol listen address",
		func(o *options, v string) error { o.server.Listen = v; return nonEmpty(v) }},
	{"health-listen", server.DefaultHealthListen, "health/metrics HTTP listen address",
		func(o *options, v string) error { o.server.HealthListen = v; return nonEmpty(v) }},
	{"auth-token", "", "shared token every hello must carry in auth (empty: no auth); prefer auth-token-file or the environment: a flag is visible to every local user",
		func(o *options, v string) error { o.server.AuthToken = v; return nil }},
	{"auth-token-file", "", "file holding auth-token (one line; a trailing newline is dropped)",
		secretFileSetting("auth-token", func(o *options) *string { return &o.server.AuthToken })},
	{"admin-token", "", "bearer token that enables the admin endpoints of the health listener (POST /admin/backup, pprof, conversation ids in /unloadable-conversations); empty: disabled; prefer admin-token-file",
		func(o *options, v string) error { o.server.AdminToken = v; return nil }},
	{"admin-token-file", "", "file holding admin-token (one line; a trailing newline is dropped)",
		secretFileSetting("admin-token", func(o *options) *string { return &o.server.AdminToken })},
	{"allow-open-admission", "false", "allow listen or ws-listen beyond loopback with no auth-token, no tls-client-ca and enroll-policy open, where anyone who can connect may enroll into any conversation and read it; without it such a start is refused",
		boolSetting(func(o *options) *bool { return &o.allowOpenAdmission })},
	{"admin-token-auto", "true", "without admin-token and with a loopback health-listen, generate an admin token at each start and write it to the data directory's " + server.AdminTokenFile + " (0600), where participantctl status on this host finds it (--data); false: no admin endpoints without admin-token",
		boolSetting(func(o *options) *bool { return &o.server.LocalAdminToken })},
	{"admin-remote", "false", "serve the admin endpoints and pprof to peers beyond loopback (on a health-listen beyond loopback it needs health-tls-cert); without it they answer loopback peers only (403 to others), so a health-listen beyond loopback serves probes and /metrics while the admin endpoints stay inside the host or pod (kubectl port-forward)",
		boolSetting(func(o *options) *bool { return &o.server.AdminRemote })},
	{"tls-cert", "", "PEM certificate: serve the wire listener over TLS (with tls-key); SIGHUP reloads it",
		func(o *options, v string) error { o.server.TLSCert = v; return nil }},
	{"tls-key", "", "PEM private key of tls-cert",
		func(o *options, v string) error { o.server.TLSKey = v; return nil }},
	{"tls-client-ca", "", "PEM CA file: with tls-cert, every wire connection must present a client certificate it signed (mutual TLS)",
		func(o *options, v string) error { o.server.TLSClientCA = v; return nil }},
	{"ws-listen", "", "WebSocket listen address serving the same protocol, one binary message per frame (empty: off); wss with tls-cert",
		func(o *options, v string) error { o.server.WSListen = v; return nil }},
	{"ws-allowed-origins", "", "comma-separated host patterns (such as app.example.com or *.example.com) of browser pages allowed on ws-listen besides its own host, and the names a browser may reach it by besides IP literals and localhost (DNS rebinding); a client sending no Origin (not a browser) is always allowed",
		func(o *options, v string) error { o.server.WSAllowedOrigins = server.ParseEndpoints(v); return nil }},
	{"health-tls-cert", "", "PEM certificate: serve the health listener over HTTPS (with health-tls-key); SIGHUP reloads it",
		func(o *options, v string) error { o.server.HealthTLSCert = v; return nil }},
	{"health-tls-key", "", "PEM private key of health-tls-cert",
		func(o *options, v string) error { o.server.HealthTLSKey = v; return nil }},
	{"health-hosts", "", "comma-separated host names the health listener answers to besides IP literals and localhost (a request naming another Host gets 421, except /health and /ready: DNS rebinding)",
		func(o *options, v string) error { o.server.HealthHosts = server.ParseEndpoints(v); return nil }},
	{"max-frame", strconv.Itoa(wire.DefaultMaxFrame), "largest frame body accepted, bytes (announced in welcome)",
		intSetting(func(o *options) *int { return &o.server.MaxFrame })},
	{"max-record-bytes", strconv.Itoa(participant.DefaultMaxRecordBytes), "largest tell payload, bytes",
		intSetting(func(o *options) *int { return &o.server.MaxRecordBytes })},
	{"receipt-ttl", "24h", "how long enroll/attach answers replay their secret",
		durationSetting(func(o *options) *time.Duration { return &o.server.ReceiptTTL })},
	{"drain-timeout", server.DefaultDrainTimeout.String(), "how long the drain on SIGTERM/SIGINT may take",
		durationSetting(func(o *options) *time.Duration { return &o.server.DrainTimeout })},
	{"store-close-timeout", server.DefaultStoreCloseTimeout.String(), "how long, after the drain, the shutdown waits for the store (operations still inside it, background checkpoints, closing it); past it a store that stopped answering (a dead disk, a hung NFS mount) is given up on: logged at error level, exit 1",
		durationSetting(func(o *options) *time.Duration { return &o.server.StoreCloseTimeout })},
	{"hello-timeout", server.DefaultHelloTimeout.String(), "how long a new connection may take to send hello",
		durationSetting(func(o *options) *time.Duration { return &o.server.HelloTimeout })},
	{"write-progress-timeout", server.DefaultWriteProgressTimeout.String(), "close a connection one of whose outbound frames waited this long to be written (a peer that stops reading or reads a trickle)",
		durationSetting(func(o *options) *time.Duration { return &o.server.WriteProgressTimeout })},
	{"max-outbound-bytes", strconv.Itoa(server.DefaultMaxOutboundBytes), "bytes of frames queued for one connection's writer before answers and pushes wait (raised to max-frame + 4 if below)",
		intSetting(func(o *options) *int { return &o.server.MaxOutboundBytes })},
	{"max-outbound-bytes-total", strconv.Itoa(server.DefaultMaxOutboundTotal), "bytes of frames queued for all connections' writers before answers and pushes wait",
		intSetting(func(o *options) *int { return &o.server.MaxOutboundTotal })},
	{"max-pending-bytes", strconv.Itoa(server.DefaultMaxPendingBytes), "frame bytes of one connection's requests queued or running before reading pauses (raised to max-frame if below)",
		intSetting(func(o *options) *int { return &o.server.MaxPendingBytes })},
	{"max-pending-bytes-total", strconv.Itoa(server.DefaultMaxPendingBytesTotal), "frame bytes of all connections' requests queued or running before reading pauses",
		intSetting(func(o *options) *int { return &o.server.MaxPendingBytesTotal })},
	{"log-memory", strconv.Itoa(server.DefaultLogMemoryBytes), "bytes of committed batches the log-first store holds in memory until a checkpoint writes them to the bbolt file; past it commits wait",
		intSetting(func(o *options) *int { return &o.server.LogMemoryBytes })},
	{"wal-segment-size", strconv.Itoa(server.DefaultWALSegmentSize), "bytes each log segment of the log-first store is preallocated to (at least 1 MiB); a start needs this much free space plus the bbolt file's next growth (its size, 32 KiB to 16 MiB), and refuses, saying both, on a disk without it",
		intSetting(func(o *options) *int { return &o.server.WALSegmentSize })},
	{"pipeline-batches", "true", "hand a conversation's turn to its next batch of tells and acks once a batch's rows are appended, before they are durable, where the store keeps its writes' order (docs/DESIGN.md, Pipelined batches); false keeps every batch's turn until its commit is durable: a diagnostic switch to measure against, the answers are the same",
		offSetting(func(o *options) *bool { return &o.server.NoPipeline })},
	{"heap-goal", heapGoalMedian, "how the Go collector's heap goal is set: median (the default: a memory limit follows the median live heap of the last 64 collections, so one collection's peak does not raise the resident memory for good; GOMEMLIMIT stays the ceiling) or runtime (the runtime's own goal, twice the last collection's live heap at GOGC=100)",
		func(o *options, v string) error {
			switch v {
			case heapGoalMedian, heapGoalRuntime:
				o.heapGoal = v
				return nil
			}
			return errors.New("want median or runtime")
		}},
	{"backlog-memory", strconv.Itoa(participant.DefaultMaxBacklogBytes), "payload bytes of unacknowledged records kept in memory; past it they are read back from the store",
		intSetting(func(o *options) *int { return &o.server.MaxBacklogBytes })},
	{"max-backlog-records", strconv.Itoa(participant.DefaultMaxBacklogRecords), "records one conversation retains until every recipient acknowledged them; past it enroll, tell and attach are backlog_full (retry later), ack, detach and leave still commit",
		intSetting(func(o *options) *int { return &o.server.MaxBacklogRecords })},
	{"backlog-records", strconv.Itoa(participant.DefaultBacklogRecords), "records all conversations retain together (~20 bytes of memory each); past it the conversations retaining the most are backlog_full, and a quarter past it all that add records",
		intSetting(func(o *options) *int { return &o.server.BacklogRecords })},
	{"client-share", strconv.Itoa(participant.DefaultClientShare), "percent of backlog-records and of max-conversations that the conversations of one peer address (an IPv6 /64) may take (under tls-client-ca: of one client certificate identity, whatever its address); past it its enroll, tell and attach are backlog_full or capacity_exceeded (loopback exempt unless limit-loopback)",
		intSetting(func(o *options) *int { return &o.server.ClientShare })},
	{"max-connections", strconv.Itoa(server.DefaultMaxConnections), "open connections; one more is rejected overloaded",
		intSetting(func(o *options) *int { return &o.server.MaxConnections })},
	{"max-connections-per-address", strconv.Itoa(server.DefaultMaxConnectionsPerAddress), "open connections of one peer address (an IPv6 /64); one more is rejected overloaded (loopback exempt unless limit-loopback)",
		intSetting(func(o *options) *int { return &o.server.MaxConnectionsPerAddress })},
	{"connection-rate", strconv.Itoa(server.DefaultConnectionRate), "new connections a second one peer address may open (a burst of one second's worth); past it they are rejected overloaded (loopback exempt unless limit-loopback)",
		func(o *options, v string) error {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || !(f > 0) {
				return errors.New("want a positive number")
			}
			o.server.ConnectionRate = f
			return nil
		}},
	{"conversation-rate", strconv.Itoa(server.DefaultConversationRate), "new conversations a second one peer address may create by enrolling, from a bucket of conversation-burst; past it such an enroll is rate_limited (a loopback peer, exempt unless limit-loopback, gets a bucket per connection)",
		func(o *options, v string) error {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || !(f > 0) {
				return errors.New("want a positive number")
			}
			o.server.ConversationRate = f
			return nil
		}},
	{"conversation-burst", strconv.Itoa(server.DefaultConversationBurst), "new conversations one peer address may create at once (see conversation-rate)",
		intSetting(func(o *options) *int { return &o.server.ConversationBurst })},
	{"ipv4-prefix", strconv.Itoa(server.DefaultIPv4Prefix), "prefix length that makes one peer address of IPv4 peers, for the per-address limits and the client shares (32: each address)",
		intSetting(func(o *options) *int { return &o.server.IPv4Prefix })},
	{"ipv6-prefix", strconv.Itoa(server.DefaultIPv6Prefix), "prefix length that makes one peer address of IPv6 peers, for the per-address limits and the client shares (64: one host's /64; 56 or 48 count a site given many /64s as one peer)",
		intSetting(func(o *options) *int { return &o.server.IPv6Prefix })},
	{"limit-loopback", "false", "apply max-connections-per-address, connection-rate and conversation-rate to loopback peers as to any address (exempt by default: this machine, or a proxy in front of it)",
		boolSetting(func(o *options) *bool { return &o.server.LimitLoopback })},
	{"idle-timeout", server.DefaultIdleTimeout.String(), "close, with bye{idle}, a connection that holds no binding and sent nothing for this long (0: never)",
		func(o *options, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return errors.New("want 0 (off) or a positive duration such as 5m")
			}
			if d == 0 {
				d = -1 // off; the zero Config means the default
			}
			o.server.IdleTimeout = d
			return nil
		}},
	{"frame-read-timeout", server.DefaultFrameReadTimeout.String(), "how long a frame's body may take to arrive once its header did (it holds its size of the pending budgets meanwhile); past it the connection is closed",
		durationSetting(func(o *options) *time.Duration { return &o.server.FrameReadTimeout })},
	{"max-pending", strconv.Itoa(server.DefaultMaxPending), "requests of one connection queued or running before reading pauses",
		intSetting(func(o *options) *int { return &o.server.MaxPending })},
	{"max-participants", strconv.Itoa(participant.DefaultMaxParticipants), "participants per conversation (capacity_exceeded past it)",
		intSetting(func(o *options) *int { return &o.server.MaxParticipants })},
	{"max-conversations-per-connection", strconv.Itoa(participant.DefaultMaxConversationsPerConn), "bindings one connection may hold (capacity_exceeded past it)",
		intSetting(func(o *options) *int { return &o.server.MaxConversationsPerConn })},
	{"log-format", "auto", "json (one object per line), console (human-readable; coloured only on a terminal), or auto: console when standard error is a terminal, else json",
		func(o *options, v string) error {
			switch v {
			case "json", "console", "auto":
				o.logFormat = v
				return nil
			}
			return errors.New("want json, console or auto")
		}},
	{"pprof", "false", "serve Go's profiles under /debug/pprof/ on the health listener, to requests carrying admin-token (which it needs); at most " + strconv.Itoa(server.MaxProfileSeconds) + " s a profile, no cmdline",
		boolSetting(func(o *options) *bool { return &o.server.Pprof })},
	{"otlp-endpoint", "", "OpenTelemetry tracing: export a span per request, per group commit (linked to its requests) and per barrier over OTLP/gRPC to this collector URL (http://host:4317 plaintext, https:// TLS); the standard OTEL_EXPORTER_OTLP_* and OTEL_TRACES_SAMPLER variables tune it; empty (the default) traces nothing",
		func(o *options, v string) error {
			e, err := parseOTLPEndpoint(v)
			o.otlpEndpoint = e
			return err
		}},
	// Admission and quotas.
	{"enroll-policy", string(participant.EnrollOpen), "who may enroll: open (anyone who can connect) or invite (an invitation from participantctl invite); open beyond loopback without auth-token logs a warning",
		func(o *options, v string) error {
			p, err := participant.ParseEnrollPolicy(v)
			if err != nil {
				return errors.New("want open or invite")
			}
			o.server.EnrollPolicy = p
			return nil
		}},
	{"max-conversations", "auto", "conversations the store may hold (in cluster mode, this node); the first enroll of one more is capacity_exceeded. auto: half the memory the process may use (cgroup limit, machine total, GOMEMLIMIT) at about 5 KB a conversation, between 1000 and " + strconv.Itoa(participant.DefaultMaxConversations) + "; the start-up log says the value",
		func(o *options, v string) error {
			if v == "auto" {
				o.server.MaxConversations = 0 // server.MachineConversations
				return nil
			}
			return intSetting(func(o *options) *int { return &o.server.MaxConversations })(o, v)
		}},
	{"max-data-bytes", strconv.FormatInt(server.DefaultMaxDataBytes, 10), "bytes the store holds (" + server.StoreFile + "'s pages in use, free pages not counted, plus the log not yet checkpointed) past which enroll and tell are capacity_exceeded until compaction frees enough (ack, detach, leave still commit); keep it below the disk's free space",
		func(o *options, v string) error {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n <= 0 {
				return errors.New("want a positive number of bytes")
			}
			o.server.MaxDataBytes = n
			return nil
		}},
	{"checkpoint-interval", participant.DefaultCheckpointInterval.String(), "how often conversation checkpoints are written in the background (a start replays only the rows after them)",
		durationSetting(func(o *options) *time.Duration { return &o.server.CheckpointInterval })},
	{"checkpoint-rows", strconv.Itoa(participant.DefaultCheckpointRows), "rows past its checkpoint a conversation must be for a new one",
		intSetting(func(o *options) *int { return &o.server.CheckpointRows })},
	{"retain", "168h", "keep settled history (records every recipient acknowledged) this long after the last acknowledgement, then compact it; token replays survive compaction",
		durationSetting(func(o *options) *time.Duration { return &o.server.Retain })},
	{"max-unacked-age", "0s", "release records some recipient has not acknowledged this long after they committed: compaction may then remove them (after retain), and that recipient's next delivery is a compacted notice (0: off, records wait for every acknowledgement forever)",
		nonNegativeDurationSetting(func(o *options) *time.Duration { return &o.server.MaxUnackedAge })},
	{"token-window", "0s", "bound token deduplication in time: every token must then be a UUIDv7 (the Go client's client.NewToken draws them), a token older than this that is not committed is refused token_expired, and compaction forgets older tokens so disk stays bounded (0: off, every token's answer is kept forever)",
		nonNegativeDurationSetting(func(o *options) *time.Duration { return &o.server.TokenWindow })},
	{"token-skew", participant.DefaultTokenSkew.String(), "with token-window: how far ahead of this server's clock a token's time may be before it is refused token_invalid",
		durationSetting(func(o *options) *time.Duration { return &o.server.TokenSkew })},
	// Cluster mode (docs/DESIGN.md "Cluster mode"): set etcd-endpoints to turn it on.
	{"etcd-endpoints", "", "comma-separated etcd client URLs: cluster mode, data in etcd (empty: a single node on its embedded store, see --store)",
		func(o *options, v string) error { o.server.Cluster.Endpoints = server.ParseEndpoints(v); return nil }},
	{"etcd-prefix", etcdstore.DefaultPrefix, "etcd key prefix of the data set (cluster mode)",
		func(o *options, v string) error { o.server.Cluster.Prefix = v; return nonEmpty(v) }},
	{"node-id", "", "this node's id in the cluster (default: derived once, kept in the data directory as " + server.NodeIDFile + ")",
		func(o *options, v string) error {
			if strings.ContainsAny(v, "/ \t") {
				return errors.New("no '/' or spaces")
			}
			o.server.Cluster.NodeID = v
			return nil
		}},
	{"advertise", "", "wire address clients are sent to (moved) for this node's conversations (default: the listen address)",
		func(o *options, v string) error { o.server.Cluster.Advertise = v; return nil }},
	{"lease-ttl", cluster.DefaultLeaseTTL.String(), "ownership lease; a dead node's conversations move after about this long",
		durationSetting(func(o *options) *time.Duration { return &o.server.Cluster.LeaseTTL })},
	{"etcd-leader-affinity", "true", "send commits to the etcd leader over a connection of their own, falling back to every endpoint while it is unknown (cluster mode)",
		offSetting(func(o *options) *bool { return &o.server.Cluster.NoLeaderAffinity })},
	{"etcd-ca", "", "PEM CA file verifying the etcd servers (TLS to etcd)",
		func(o *options, v string) error { o.server.Cluster.CA = v; return nil }},
	{"etcd-cert", "", "PEM client certificate for etcd (with etcd-key)",
		func(o *options, v string) error { o.server.Cluster.Cert = v; return nil }},
	{"etcd-key", "", "PEM private key of etcd-cert",
		func(o *options, v string) error { o.server.Cluster.Key = v; return nil }},
	{"etcd-username", "", "etcd user (with etcd-password)",
		func(o *options, v string) error { o.server.Cluster.Username = v; return nil }},
	{"etcd-password", "", "etcd password; prefer etcd-password-file or the environment",
		func(o *options, v string) error { o.server.Cluster.Password = v; return nil }},
	{"etcd-password-file", "", "file holding etcd-password (one line; a trailing newline is dropped)",
		secretFileSetting("etcd-password", func(o *options) *string { return &o.server.Cluster.Password })},
	{"etcd-secret-key-file", "", "file (mode 0600) holding the key that seals the cluster secret in etcd: 32 bytes, or 64 hex digits (openssl rand -hex 32); give every node the same file. A secret found unsealed is sealed; a sealed one is refused without it",
		func(o *options, v string) error { o.server.Cluster.SealKeyFile = v; return nil }},
	{"etcd-previous-secret-key-file", "", "with etcd-secret-key-file, the sealing key being rotated out (same format): a cluster secret sealed under it is sealed again under the new key; give every node both, restart them, then drop this one",
		func(o *options, v string) error { o.server.Cluster.PreviousSealKeyFile = v; return nil }},
	{"log-level", "info", "debug (adds one line per request), info, warn or error",
		func(o *options, v string) error {
			l, err := zerolog.ParseLevel(v)
			if err != nil || v == "" {
				return fmt.Errorf("want debug, info, warn or error")
			}
			o.logLevel = l
			return nil
		}},
}

// secretFile is a secret setting given as the file that holds it.
type secretFile struct {
	name  string                 // the secret setting: auth-token, ...
	path  string                 // the file
	field func(*options) *string // where the secret goes
}

// secretFileSetting is the setting secret-file, naming the file that holds
// the secret setting secret, whose value field points to.
func secretFileSetting(secret string, field func(*options) *string) func(*options, string) error {
	return func(o *options, v string) error {
		if v != "" {
			o.secretFiles = append(o.secretFiles, secretFile{secret, v, field})
		}
		return nil
	}
}

// readSecretFiles fills each secret given as a file, refusing one given
// both ways or a file that is empty. A trailing newline is dropped, as
// editors and `echo` add one.
func readSecretFiles(o *options) error {
	for _, secret := range o.secretFiles {
		field := secret.field(o)
		if *field != "" {
			return fmt.Errorf("%s and %s-file are both given: give one", secret.name, secret.name)
		}
		b, err := os.ReadFile(secret.path)
		if err != nil {
			return fmt.Errorf("%s-file: %w", secret.name, err)
		}
		v := strings.TrimRight(string(b), "\r\n")
		if v == "" {
			return fmt.Errorf("%s-file %s is empty", secret.name, secret.path)
		}
		*field = v
	}
	return nil
}

func boolSetting(field func(*options) *bool) func(*options, string) error {
	return func(o *options, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return errors.New("want true or false")
		}
		*field(o) = b
		return nil
	}
}

// offSetting is boolSetting negated: the setting names what it turns on
// (default true), and field is the configuration's No- switch of it.
func offSetting(field func(*options) *bool) func(*options, string) error {
	return func(o *options, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return errors.New("want true or false")
		}
		*field(o) = !b
		return nil
	}
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

// nonNegativeDurationSetting is a durationSetting for which 0 means off.
func nonNegativeDurationSetting(field func(*options) *time.Duration) func(*options, string) error {
	return func(o *options, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return errors.New("want 0 (off) or a positive duration such as 10m or 24h")
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

// boolValue is a rawValue for a setting whose default is "true" or
// "false": --pprof alone means --pprof=true.
type boolValue struct{ rawValue }

func (boolValue) IsBoolFlag() bool { return true }

// parseOptions resolves every setting: flag, then environment, then the
// config file, then the default. Unknown flags, unknown PARTICIPANTD_
// variables, unknown config file keys and invalid values are errors that
// name the key and where it came from.
func parseOptions(args, environ []string, usageOut io.Writer) (options, error) {
	fs := flag.NewFlagSet("participantd", flag.ContinueOnError)
	flags := make(map[string]*string)
	for _, s := range append([]setting{{name: configKey}}, settings...) {
		v := new(string)
		flags[s.name] = v
		if s.def == "true" || s.def == "false" {
			fs.Var(boolValue{rawValue{v}}, s.name, s.help)
			continue
		}
		fs.Var(rawValue{v}, s.name, s.help)
	}
	version := fs.Bool("version", false, "print the version and build, then exit")
	healthcheck := fs.Bool("healthcheck", false, "probe /ready of the server at health-listen; exit 0 when ready, 1 otherwise")
	generate := fs.Bool("generate-token", false, "print a new random token (32 bytes, base64url) for auth-token or admin-token, then exit")
	// The flag package prints a bad flag's error and then the whole usage:
	// silence it, so that run prints the error and a pointer to -h alone.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(usageOut)
		}
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

	o := options{version: *version, healthcheck: *healthcheck, generateToken: *generate}
	if o.generateToken {
		return o, nil
	}
	sources := make(map[string]string) // where each setting given came from
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
			if secretSetting(s.name) {
				shown = "(hidden)"
			}
			return options{}, fmt.Errorf("invalid %s %s (from %s): %w", s.name, shown, from, err)
		}
		if v != "" {
			sources[s.name] = from
		}
		if secretSetting(s.name) && v != "" {
			if given[s.name] {
				o.warnings = append(o.warnings, fmt.Sprintf("--%s is on the command line, which every local user can read (ps, /proc/PID/cmdline): use --%s-file or %s", s.name, s.name, envName(s.name)))
			}
			v = "(redacted)"
		}
		o.effective = append(o.effective, effectiveSetting{s.name, v, from})
	}
	if err := readSecretFiles(&o); err != nil {
		return options{}, err
	}
	for _, f := range o.secretFiles {
		sources[f.name] = f.path + " via " + sources[f.name+"-file"]
	}
	if err := checkSecrets(&o, sources); err != nil {
		return options{}, err
	}
	if err := checkOpenAdmission(&o); err != nil {
		return options{}, err
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

participantd serves the participantd wire protocol (docs/PROTOCOL.md) on an
embedded store: a write-ahead log checkpointed into a bbolt file (--store
bbolt: the bbolt file alone). With no flags it uses ./data and listens on loopback.

  --version
        print the version and build (module version, VCS revision), then exit
  --healthcheck
        probe GET /ready on health-listen (an unspecified host such as 0.0.0.0
        means this machine); exit 0 when ready, 1 otherwise. For container
        health checks: the image needs no HTTP client.
  --generate-token
        print a new random token (32 bytes from the system's secure
        generator, base64url) for auth-token-file or admin-token-file, then
        exit. auth-token and admin-token are refused at start below 128 bits
        (32 hex digits, 22 base64 characters) or holding a placeholder word.

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
/unloadable-conversations (conversation ids only with the admin token),
/debug/pprof/ with --pprof and the admin token, and POST /admin/backup with
--admin-token (participantctl backup). Secrets (auth-token, admin-token,
etcd-password) are best given as files (--auth-token-file, ...) or in the
environment: a flag is visible to every local user. SIGHUP reloads the TLS
certificates.
Start-up logs one line with the effective configuration (secrets redacted).
Signals: SIGTERM or SIGINT drains (exit 0 within --drain-timeout, then
--store-close-timeout for the store; exit 1 if the store stopped answering);
a second one exits at once with status 2.
`)
}
