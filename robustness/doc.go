// Package robustness is participantd's robustness suite: real processes
// and a real network, in the manner of etcd's tests/robustness (traffic,
// failpoints, a model, a report per failure) and of Jepsen's nemeses. It
// holds tests only.
//
// Each seed of TestRobustness runs three participantd processes in
// cluster mode (built once with `go build -tags faulthook`, for the clock
// hook of cmd/participantd/faulthook.go) over a 3-member etcd embedded in
// the test process. Every connection a fault may cut goes through a
// toxiproxy proxy on loopback: each node reaches each etcd member through
// a proxy of its own, and clients reach each node through one (the node's
// advertised address).
//
// # Traffic
//
// Per conversation, writers (client.Cluster, one operation at a time,
// each with its own token, resent with that token until answered; one
// tell in 16 larger than max_record_bytes; a detach at the end) and
// readers that enroll once and then only read their deliveries: no ack,
// no tell, so that a reader follows its conversation to a new owner only
// if the client does so by itself. Their binding check runs every lease:
// a node that lost its lease with its connections up (a pause) ends their
// bindings without a word, and only the check finds them gone.
//
// # Nemeses
//
// A schedule drawn from the seed, one fault at a time, each followed by
// a settling time of half a lease to a lease, the kinds in rounds that
// each hold every nemesis once:
//
//	kill               SIGKILL a node; restart it after up to half a lease
//	pause              SIGSTOP a node for 1.5 to 2.5 leases, then SIGCONT
//	partition-etcd     drop every byte between a node and every etcd member
//	partition-clients  drop every byte between the clients and a node
//	clock              offset a node's wall clock by up to ±45 s (it stays)
//
// and, after the traffic, a restore: the data set is backed up and
// restored into a fresh prefix while a new node starts on it, both over a
// network slowed by 50 ms each way and started a seeded delay apart, and
// a client tries to attach through the new node all along: nothing may be
// answered before the restore ends.
//
// # Invariants
//
// No node process may end by itself (a kill nemesis's restart does not
// hide one that did). After the traffic every answered tell is resent
// with its token, and the readers get a failover and two binding
// checks (deliveryWait) to catch up; then
// etcd's data set, read through the offline tools' view, is checked
// against the clients' history (check_test.go): every answered tell is in
// the log exactly once at its answered seq, no token commits twice, every
// answer of a token names one seq, a refused attempt's token is not in
// the log (a resend at the end may be refused only token_expired, once
// the token window passed), no writer loses its participant, record seqs
// run without gap or repeat, bindings end once, every conversation loads,
// and each reader got, in order, exactly the log's records, every one
// addressed to it. What the client told the writers is checked too
// (docs/clients.md, What a client's answers promise): an oversized tell
// is refused too_large at once, never in doubt; no call returns long
// after its context ended; an answered detach is its participant's
// detached record in the log, and no attach of it follows.
//
// # Runs
//
// `go test ./robustness` runs two fixed seeds of 15 s of traffic each
// (about 90 s on a 2-core machine, under -race too); -short skips them. A long run:
//
//	go test ./robustness -run TestRobustness -timeout 0 \
//		-robustness.duration=30m -robustness.seeds=11,12,13
//
// -robustness.nemeses=pause,kill restricts the schedule to the nemeses
// named, to tell which fault finds a failure; -robustness.keep keeps the
// report of a run that passed.
//
// # Rolling restart
//
// TestRollingRestart carries out docs/operations.md's rolling restart of
// a cluster, step by step (rollingSteps; a test fails when the docs list
// other steps), on three nodes of the release build with a conversation
// first owned by each, writers and readers running throughout: a cluster
// backup through participantctl, then per node the healthcheck of every
// node, SIGTERM (the process must exit 0), the binary replaced, the start
// and its healthcheck, and a tell answered for every writer before the
// next node. No call may end refused, in doubt or lost, and the history
// is checked as a seed's is. About 30 s; -short skips it.
//
// A failed seed leaves a directory (named in the failure) holding
// REPORT.md (the violations, the schedule, what happened when, the
// traffic, the nodes' warnings, the command that runs the seed again),
// history.jsonl, deliveries.jsonl, the node logs and etcd's data.
package robustness
