// Package wire is the participantd wire protocol, version 1: the frame codec
// and one Go type per message of PROTOCOL.md, in both directions. It is a
// leaf: it imports nothing of the project.
package wire
