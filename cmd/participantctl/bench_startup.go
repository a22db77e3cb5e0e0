package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/participantd/participantd/cmd/participantd/server"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store"
)

// startupFigure is the time to ready of one data directory size.
type startupFigure struct {
	Conversations int     `json:"conversations"`
	Records       int     `json:"records"`
	FileBytes     int64   `json:"file_bytes"`
	BuildSeconds  float64 `json:"build_seconds"`
	ReadySeconds  float64 `json:"ready_seconds"`
}

// runStartup builds data directories of 1/10, 3/10 and all of
// f.startupRecords tell records over as many tenths of
// f.startupConversations conversations, and times an embedded server from
// Run to a 200 on /ready for each. Each conversation has two participants,
// both left bound, as a crash leaves them: the start must end every binding
// as died/unclean_restart through the two barriers, on top of reconciling.
func runStartup(ctx context.Context, e *env, f *benchFlags) error {
	rep := &benchReport{Machine: thisMachine()}
	root := f.dataDir
	if root == "" {
		dir, err := os.MkdirTemp("", "participantd-startup-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		root = dir
	}
	rep.DataDir = root
	if f.probe {
		rate, err := fsyncProbe(root, f.probeDuration)
		if err != nil {
			return err
		}
		rep.FsyncPerSec = rate
	}
	for _, tenths := range []int{1, 3, 10} {
		convs := max(1, f.startupConversations*tenths/10)
		records := f.startupRecords * tenths / 10
		dir := filepath.Join(root, fmt.Sprintf("size-%d", tenths))
		fig := startupFigure{Conversations: convs, Records: records}
		start := time.Now()
		if err := buildDataDir(ctx, dir, convs, records, f.load.payload); err != nil {
			return err
		}
		fig.BuildSeconds = time.Since(start).Seconds()
		if fi, err := os.Stat(filepath.Join(dir, server.StoreFile)); err == nil {
			fig.FileBytes = fi.Size()
		}
		ready, err := timeToReady(ctx, dir)
		if err != nil {
			return err
		}
		fig.ReadySeconds = ready.Seconds()
		rep.Startup = append(rep.Startup, fig)
		os.RemoveAll(dir)
	}
	return rep.print(e.stdout, f.json)
}

// timeToReady starts a server on dir and returns the time from Run to the
// first 200 of GET /ready.
func timeToReady(ctx context.Context, dir string) (time.Duration, error) {
	srv, err := server.New(server.Config{DataDir: dir, Listen: "127.0.0.1:0", HealthListen: "127.0.0.1:0"})
	if err != nil {
		return 0, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- srv.Run(runCtx) }()
	defer func() {
		cancel()
		<-done
	}()
	url := "http://" + srv.HealthAddr().String() + "/ready"
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Since(start), nil
			}
		}
		select {
		case err := <-done:
			done <- err
			return 0, fmt.Errorf("server on %s ended before ready: %w", dir, err)
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// buildDataDir writes a data directory of convs conversations holding
// records tell records in all. It runs the real service on an in-memory
// store (the rows are exactly what a server commits) and then copies every
// stream and value into the bbolt file, flushing every few thousand
// appends: building a million records through fsyncs would take minutes
// and measures nothing the load bench does not.
func buildDataDir(ctx context.Context, dir string, convs, records, payload int) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	key, err := participant.LoadOrCreateNodeKey(dir)
	if err != nil {
		return err
	}
	mem := store.NewMemory()
	svc, err := participant.Open(ctx, mem, participant.Options{NodeKey: key})
	if err != nil {
		return err
	}
	body := make([]byte, payload)
	jobs := make(chan int)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for c := range jobs {
				n := records / convs
				if c < records%convs {
					n++
				}
				if err := fillConversation(ctx, svc, participant.ConversationID(c+1), n, body); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for c := range convs {
		jobs <- c
	}
	close(jobs)
	wg.Wait()
	svc.Close()
	close(errs)
	if err := errors.Join(collect(errs)...); err != nil {
		return err
	}
	return copyToBolt(mem, filepath.Join(dir, server.StoreFile), convs)
}

func fillConversation(ctx context.Context, svc *participant.Service, conv participant.ConversationID, n int, body []byte) error {
	tok := func(who, i uint64) participant.Token {
		var t participant.Token
		binary.BigEndian.PutUint64(t[:8], who+1)
		binary.BigEndian.PutUint64(t[8:], i+1)
		return t
	}
	sender, recipient := svc.Connect(nil), svc.Connect(nil)
	b, err := sender.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(0, 0)})
	if err != nil {
		return err
	}
	if _, err := recipient.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(1, 0)}); err != nil {
		return err
	}
	for i := range n {
		if _, err := sender.Tell(ctx, participant.Tell{Conversation: conv, Participant: b.Participant, Generation: b.Generation, Token: tok(0, uint64(i+1)), Payload: body}); err != nil {
			return err
		}
	}
	return nil
}

// copyToBolt copies the registry, every conversation's streams and every
// value of mem into a new bbolt file.
func copyToBolt(mem *store.Memory, path string, convs int) error {
	bolt, err := store.Open(path, store.Options{})
	if err != nil {
		return err
	}
	pending := 0
	cp := func(stream string) error {
		entries, err := mem.ReadFrom(stream, 0, 0)
		if err != nil {
			return err
		}
		for _, en := range entries {
			if _, err := bolt.Append(stream, en.Payload, en.Seq); err != nil {
				return err
			}
		}
		if pending += len(entries); pending >= 20000 {
			pending = 0
			return bolt.Flush()
		}
		return nil
	}
	err = cp(participant.RegistryStream)
	for c := 1; c <= convs && err == nil; c++ {
		id := participant.ConversationID(c)
		if err = cp(oplog.Stream(id)); err == nil {
			err = cp(outbox.Stream(id))
		}
	}
	if err == nil {
		var vals []store.Value
		if vals, err = mem.Scan(""); err == nil {
			for _, v := range vals {
				if err = bolt.CAS(v.Key, 0, v.Value); err != nil {
					break
				}
			}
		}
	}
	if err == nil {
		err = bolt.Flush()
	}
	if cerr := bolt.Close(); err == nil {
		err = cerr
	}
	return err
}
