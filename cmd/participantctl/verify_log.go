package main

import (
	"fmt"

	"github.com/participantd/participantd/offline"
)

// logSummary describes the write-ahead log of the stopped data directory
// dir, replayed read-only (offline.Replay): how many records follow the
// last checkpoint, and an unfinished last record if there is one; "" when
// the bbolt file holds everything (a clean stop, or no log). A corrupt log
// is an error naming the segment and offset.
func logSummary(dir string) (string, error) {
	rp, err := offline.Replay(dir, offlineOptions)
	if err != nil {
		return "", explainOpen(dir, err)
	}
	if rp.Log.Records == 0 && !rp.Log.Torn {
		return "", nil
	}
	line := fmt.Sprintf("log: ok, %d records after checkpoint LSN %v in %d segments", rp.Log.Records, rp.CheckpointLSN, rp.Log.Segments)
	if rp.Log.Torn {
		line += fmt.Sprintf("; an unfinished last record at %s offset %d (never acknowledged; the server cuts it off at start)",
			rp.Log.TornSegment, rp.Log.TornOffset)
	}
	return line, nil
}
