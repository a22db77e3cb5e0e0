// Package servertest runs an embedded participantd (package server) for
// one test: it starts the server, waits until it is ready, and at the end
// of the test cancels it and checks what Run returned.
//
// Invariants:
//   - A Server returned by Start or TryStart is ready: its listeners are
//     bound and it serves.
//   - Run's goroutine is owned by the Server: Stop (or the test's cleanup,
//     which calls Stop) cancels it and waits for it to return, so no
//     server goroutine outlives the test.
//   - A non-nil error from Run fails the test once, whoever stops it.
//
// Listen and HealthListen default to 127.0.0.1:0 (a free loopback port)
// when empty; every other Config field is passed to server.New as is.
//
// SelfSigned writes the certificate and key a test serves TLS with, its
// own CA, for the server, the health listener and their clients alike.
package servertest
