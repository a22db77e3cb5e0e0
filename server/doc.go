// Package server is the participantd daemon without its command line: the
// wire listener, one goroutine set per connection, the health listener with
// Prometheus metrics, and the drain. cmd/participantd wraps it with flags,
// environment and signals; participantbench's `--embedded` starts it in
// process:
//
//	srv, err := server.New(server.Config{DataDir: dir, Listen: "127.0.0.1:0", HealthListen: "127.0.0.1:0"})
//	if err != nil { ... }
//	go func() { done <- srv.Run(ctx) }()  // cancel ctx to drain
//	select { case <-srv.Ready(): case err := <-done: ... }
//	addr := srv.Addr()                     // dial it with package wire or client
//
// New validates the Config and binds both listeners (so Addr and HealthAddr
// are known at once); Run opens the store, reconciles every conversation
// (participant.Open), then accepts, until its context is cancelled, when it
// drains.
//
// # One connection
//
// Every step has a deadline. The accept sets one for the TLS handshake
// (run after the accept, never inside it) and hello together:
// HelloTimeout. A refused connection (the server full, draining, or its
// address over MaxConnectionsPerAddress or ConnectionRate) gets rejected
// under a deadline of its own, the shorter of HelloTimeout and half the
// DrainTimeout, which a drain cuts short; at most maxRefusing are written
// at once. After welcome, reading the next frame's header waits without a
// deadline (the idle timer and a drain interrupt it), its body must arrive
// within FrameReadTimeout, and every write within WriteProgressTimeout of
// being queued. An enroll that would create a conversation takes a token
// from its address's conversation bucket (ConversationRate,
// ConversationBurst; its own bucket for an exempt loopback connection).
// The service asks for it while deciding, under the conversation's turn,
// so the bucket has a mutex of its own, a leaf, rather than Server.mu.
//
//	goroutine   owns                          ends when
//	serve       handshake, reading, teardown  the peer goes, says bye, breaks the protocol, or the server drains
//	writer      the socket's write side       teardown hands it the last frame (or a write fails)
//	pump        pushing deliveries            teardown stops it
//	worker      one conversation's requests   its queue is empty (its goroutine then parks in the server's pool, workpool.go)
//
// Requests of one conversation are applied and answered in the order read,
// by at most one worker of that conversation at a time; requests of
// different conversations run concurrently, so that their commits share the
// store's group commits. At most MaxPending requests of a connection, and
// MaxPendingBytes of their frames (MaxPendingBytesTotal across the server),
// are queued or running: past that the reader stops reading (TCP
// backpressure). Every outbound frame goes through one queue to the
// writer, bounded in bytes per connection (MaxOutboundBytes) and across the
// server (MaxOutboundTotal); the writer hands the socket up to 64 KiB of
// frames per write. A worker's answers to the requests of one batch, and
// the pump's run of deliveries of one conversation, are queued under a
// hold (writer.go): the writer is woken once for all of them, and for the
// deliveries the same batch made due when the pump is about to queue
// them, so that they leave in one write. When the client does not read, the queue fills and
// answers and pushes wait, never growing memory; and since every frame must
// be written within WriteProgressTimeout of being queued, a client that
// reads nothing or a trickle is cut, giving its budget back.
//
//	budget                 holds                              past it
//	max-pending-bytes      request frames being read or read, the reader stops reading
//	                       not answered (from the header on)
//	max-outbound-bytes     frames queued for the writer       answers and pushes wait
//	write-progress-timeout age of the oldest queued frame     the connection is cut
//	backlog-memory         payloads awaiting an ack           read back from the oplog
//	max-backlog-records    records awaiting an ack, per conv  enroll/tell/attach backlog_full
//	backlog-records        the same, across conversations     backlog_full for the largest holders
//
// # Teardown
//
//	how it ended        queued requests  last frame               bindings end as
//	read error or EOF   dropped          none                     died/connection_lost
//	frame read timeout  dropped          none                     died/connection_lost
//	idle timeout        answered         bye{reason:"idle"}       died/connection_lost (none held)
//	protocol violation  dropped          rejected{reason}         died/protocol_error
//	client bye          answered         none                     detached/clean
//	server drain        answered         bye{reason:"shutdown"}   detached/shutdown
//
// The drain (Run's context cancelled) marks the server not ready, stops
// accepting, makes the service answer shutting_down, and tears every
// connection down as above; if that takes longer than DrainTimeout, the
// remaining sockets are closed and operations cancelled. The store is closed
// last, and what follows the drain is bounded too: Run waits at most
// StoreCloseTimeout for the connections whose sockets it closed to get out
// of the store, for the service's background work and for the store's
// Close. Past that it gives up on a store that stopped answering (a dead
// disk, a hung NFS mount): it logs at error level the store call in flight
// the longest (a watchedStore between the service and the store tracks
// them), turns /ready 503 and participantd_store_failed 1, and returns
// ErrStoreHung, leaving the store open until the process exits (closeStore
// says why that is safe). So Run returns within DrainTimeout +
// StoreCloseTimeout of the cancel, whatever the store does.
//
// A store that fails for good (store.ErrFailed: a failed fsync, a full
// disk) turns /ready 503 and participantd_store_failed to 1 at once; Run
// then drains exactly as above and returns ErrStoreFailed, so that the
// process exits non-zero and its supervisor restarts it: the restart
// reconciles what the failed commits left.
package server
