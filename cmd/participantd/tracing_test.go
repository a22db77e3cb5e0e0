package main

import (
	"context"
	"net"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/server/servertest"
)

// collector is an OTLP/gRPC trace receiver that keeps what it is sent.
type collector struct {
	collectortrace.UnimplementedTraceServiceServer
	mu sync.Mutex
	// +checklocks:mu
	spans map[string]int // by name
	// +checklocks:mu
	services map[string]bool
}

func (c *collector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				c.services[a.GetValue().GetStringValue()] = true
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				c.spans[s.Name]++
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// TestStartTracing_ShutdownAfterTheDrainExportsTheSpans serves an
// enroll and a tell with the daemon's tracing pointed at an in-process
// OTLP/gRPC collector, drains the server, then shuts the provider down
// as run does: the collector has received the request, batch, barrier
// and answer spans, from service participantd.
func TestStartTracing_ShutdownAfterTheDrainExportsTheSpans(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	col := &collector{spans: map[string]int{}, services: map[string]bool{}}
	gs := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(gs, col)
	go gs.Serve(ln)
	defer gs.Stop()

	t.Setenv("OTEL_SERVICE_NAME", "")
	endpoint, err := parseOTLPEndpoint("http://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	tp, err := startTracing(context.Background(), endpoint, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	srv := servertest.Start(t, server.Config{
		DataDir: t.TempDir(), Listen: "127.0.0.1:0", HealthListen: "127.0.0.1:0", TracerProvider: tp,
	})
	ctx := context.Background()
	cl, err := client.Dial(ctx, srv.Addr().String(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cred, err := cl.Enroll(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Tell(ctx, cred, []byte("x")); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := tp.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	for _, name := range []string{server.SpanRequest, server.SpanAnswer, participant.SpanBatch, participant.SpanSharedSync} {
		if col.spans[name] == 0 {
			t.Errorf("collector got no %s span; got %v", name, col.spans)
		}
	}
	if col.spans[server.SpanRequest] != 2 {
		t.Errorf("collector got %d request spans, want 2 (enroll, tell)", col.spans[server.SpanRequest])
	}
	if !col.services["participantd"] {
		t.Errorf("collector's service names = %v, want participantd", col.services)
	}
}

func TestParseOTLPEndpoint(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"", true},
		{"http://127.0.0.1:4317", true},
		{"https://collector.example:4317", true},
		{"127.0.0.1:4317", false},
		{"grpc://127.0.0.1:4317", false},
		{"http://", false},
	} {
		if _, err := parseOTLPEndpoint(tc.in); (err == nil) != tc.ok {
			t.Errorf("parseOTLPEndpoint(%q) = %v, want ok %v", tc.in, err, tc.ok)
		}
	}
}
