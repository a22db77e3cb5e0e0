package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/participantd/participantd/internal/buildinfo"
)

// tracingFlushTimeout bounds how long the exit waits for the last spans
// to reach the collector.
const tracingFlushTimeout = 5 * time.Second

// parseOTLPEndpoint checks the otlp-endpoint setting: empty (tracing off)
// or an http:// (plaintext) or https:// URL with a host, the collector's
// OTLP/gRPC receiver.
func parseOTLPEndpoint(v string) (string, error) {
	if v == "" {
		return "", nil
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", errors.New("want an http:// or https:// URL of an OTLP/gRPC collector, such as http://127.0.0.1:4317")
	}
	return v, nil
}

// startTracing returns the TracerProvider that exports spans over
// OTLP/gRPC to endpoint, through a batch span processor. The exporter
// honours the standard OTEL_EXPORTER_OTLP_* variables (headers, timeout,
// certificates, compression) and the SDK OTEL_TRACES_SAMPLER, OTEL_BSP_*,
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; endpoint wins over
// OTEL_EXPORTER_OTLP_ENDPOINT. Export failures are logged to log, never
// fatal: tracing is an aid, and an answer never waits on it (the batch
// processor drops spans when its queue is full).
//
// The caller must Shutdown the provider, which flushes the queued spans.
func startTracing(ctx context.Context, endpoint string, log zerolog.Logger) (*sdktrace.TracerProvider, error) {
	exp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(endpoint))
	if err != nil {
		return nil, fmt.Errorf("otlp-endpoint: %w", err)
	}
	// Later options win: the environment overrides the defaults.
	res, err := resource.New(ctx,
		resource.WithAttributes(
			attribute.String("service.name", "participantd"),
			attribute.String("service.version", buildinfo.Read().Version),
		),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(),
	)
	if err != nil {
		return nil, fmt.Errorf("tracing resource: %w", err)
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn().Err(err).Msg("tracing: exporting spans failed")
	}))
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}
