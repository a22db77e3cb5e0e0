package server

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/participantd/participantd/cluster"
)

func TestEndpointAddr(t *testing.T) {
	for _, tt := range []struct{ ep, network, addr string }{
		{"http://127.0.0.1:2379", "tcp", "127.0.0.1:2379"},
		{"https://etcd.example:2379", "tcp", "etcd.example:2379"},
		{"HTTPS://[::1]:2379", "tcp", "[::1]:2379"},
		{"127.0.0.1:2379", "tcp", "127.0.0.1:2379"},
		{"unix:///run/etcd.sock", "unix", "/run/etcd.sock"},
		{"unixs://localhost:1234", "unix", "localhost:1234"},
	} {
		if network, addr := endpointAddr(tt.ep); network != tt.network || addr != tt.addr {
			t.Errorf("endpointAddr(%q) = %s %s, want %s %s", tt.ep, network, addr, tt.network, tt.addr)
		}
	}
}

// TestEtcdUnavailable: what waiting may cure (etcd not answering) is told
// from an answer (a refusal), which ends the start at once.
func TestEtcdUnavailable(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("cluster: look for a restore in progress: %w", context.DeadlineExceeded), true},
		{fmt.Errorf("cluster: grant lease: %w", rpctypes.ErrNoLeader), true},
		{status.Error(codes.Unavailable, "connection refused"), true},
		{fmt.Errorf("cluster: register node: %w", rpctypes.ErrAuthFailed), false},
		{fmt.Errorf("%w: node/a", cluster.ErrNodeIDInUse), false},
		{cluster.ErrRestoring, false},
		{errors.New("cluster: node id is required"), false},
	} {
		if got := etcdUnavailable(tt.err); got != tt.want {
			t.Errorf("etcdUnavailable(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}
