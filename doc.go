// Package participantd is the root of the participantd module: a durable
// participant server. The packages below it are the product; this package
// holds only repository-wide tests (see deps_test.go).
package participantd
