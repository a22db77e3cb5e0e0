package server

import (
	"os"
	"path/filepath"
	"strings"
)

// RestoredFile marks a data directory that participantctl restore filled
// from a backup: one line naming the backup and its time. The server reads
// it at start so that, when a credential newer than the data is refused
// stale_authority, the refusal says which backup the data came from.
const RestoredFile = "restored"

// restoredFrom returns the first line of dir's RestoredFile, at most 256
// bytes of it, or "" when there is none (or it cannot be read: the marker
// only improves a message).
func restoredFrom(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, RestoredFile))
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(string(b), "\n")
	line = strings.TrimSpace(line)
	if len(line) > 256 {
		line = line[:256]
	}
	return line
}
