package main

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/server/servertest"
)

// TestMain lets the scripts run participantctl as a command: the test
// binary, re-executed, is participantctl.
func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"participantctl": main,
	})
}

// TestScripts runs testdata/script/*.txtar: participantctl as a user runs
// it, its standard output and error compared line by line. Each script has
// its own server (data in $WORK/data), its address in PARTICIPANTCTL_ADDR
// and credentials in $WORK/creds, and these commands:
//
//	server restart [--token-window D] [AUTH-TOKEN]
//	                              drain the server and start it again on the
//	                              same address (with that token window and
//	                              auth token)
//	waitgen FILE N                wait until the credential FILE (a bare
//	                              name: in $PARTICIPANTCTL_CREDS_DIR) has
//	                              generation N or more
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir: filepath.Join("testdata", "script"),
		Setup: func(env *testscript.Env) error {
			sc := &scriptServer{t: t, dir: filepath.Join(env.WorkDir, "data"), listen: "127.0.0.1:0"}
			if err := sc.start("", 0); err != nil {
				return err
			}
			env.Defer(sc.stop)
			env.Setenv("PARTICIPANTCTL_ADDR", sc.listen)
			env.Setenv("PARTICIPANTCTL_CREDS_DIR", filepath.Join(env.WorkDir, "creds"))
			env.Values[scriptServerKey{}] = sc
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"server":  cmdServer,
			"waitgen": cmdWaitGen,
		},
	})
}

type scriptServerKey struct{}

// scriptServer is the in-process participantd of one script.
type scriptServer struct {
	t      *testing.T
	dir    string
	listen string             // the bound address once started
	srv    *servertest.Server // nil when stopped
}

func (s *scriptServer) start(auth string, window time.Duration) error {
	srv, err := servertest.TryStart(s.t, server.Config{DataDir: s.dir, Listen: s.listen, AuthToken: auth, TokenWindow: window})
	if err != nil {
		return err
	}
	s.listen, s.srv = srv.Addr().String(), srv
	return nil
}

func (s *scriptServer) stop() {
	if s.srv == nil {
		return
	}
	s.srv.Stop()
	s.srv = nil
}

func cmdServer(ts *testscript.TestScript, neg bool, args []string) {
	const usage = "usage: server restart [--token-window D] [AUTH-TOKEN]"
	if neg || len(args) < 1 || args[0] != "restart" {
		ts.Fatalf(usage)
	}
	args = args[1:]
	var window time.Duration
	if len(args) >= 2 && args[0] == "--token-window" {
		var err error
		window, err = time.ParseDuration(args[1])
		ts.Check(err)
		args = args[2:]
	}
	if len(args) > 1 {
		ts.Fatalf(usage)
	}
	auth := ""
	if len(args) == 1 {
		auth = args[0]
	}
	sc := ts.Value(scriptServerKey{}).(*scriptServer)
	sc.stop()
	// The freed port may be taken for a moment by the local end of another
	// test's connection (scripts run in parallel): retry the bind a while.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := sc.start(auth, window)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			ts.Check(err)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func cmdWaitGen(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: waitgen FILE N")
	}
	want, err := strconv.ParseUint(args[1], 10, 64)
	ts.Check(err)
	path := args[0]
	if filepath.Base(path) == path {
		path = filepath.Join(ts.Getenv("PARTICIPANTCTL_CREDS_DIR"), path)
	}
	deadline := time.Now().Add(20 * time.Second)
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		if _, err := os.Stat(path); err == nil {
			if c, err := readCreds(path); err == nil && c.Generation >= want {
				return
			}
		}
		if time.Now().After(deadline) {
			ts.Fatalf("%s did not reach generation %d", path, want)
		}
		<-t.C
	}
}
