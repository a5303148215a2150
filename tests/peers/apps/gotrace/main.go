// Command gotrace is a traced and profiled client for the end-to-end tests of
// proflow's trace_link processor. It profiles its CPU with
// github.com/grafana/pyroscope-go, pushing to -server (Pyroscope's /ingest API),
// and sends its spans over OTLP gRPC (plaintext) to -otlp. The tracer provider
// is wrapped by github.com/grafana/otel-profiling-go v0.5.3, so CPU samples
// taken inside a trace carry pprof labels span_id and span_name naming its
// local root span (and no trace_id label).
//
// Until -duration it repeats, each time in a new trace:
//
//   - a root span "hot-request": goSpanHot does 30,000 units of work (about
//     50ms of CPU), then a child span "hot-child" in which goChildHot does
//     9,000 (about 15ms);
//   - a root span "idle-request" that sleeps about 50ms and burns nothing.
//
// A unit is a thousand dependent multiply-adds, about 1.7 µs on a 2026 x86
// core. The work is fixed, not wall time spun, so each hot-request has the
// same CPU however busy the machine is (a wall-time spin gets whatever CPU is
// left: a span could get none) and the split between goSpanHot and goChildHot
// is 10:3 (76.9%) by construction.
//
// Every span the SDK exported (the OTLP export returned no error) is a line of
// -spans-out:
//
//	trace_id=<32 hex> span_id=<16 hex> parent_span_id=<16 hex or empty> name=<name> start_unix_nano=<n> end_unix_nano=<n>
//
// At the end it flushes and shuts the tracer provider down, stops the profiler
// (which uploads the last profile) and exits 0. Failed exports and uploads are
// "gotrace: " lines on stderr.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	otelpyroscope "github.com/grafana/otel-profiling-go"
	"github.com/grafana/pyroscope-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

const (
	spanHotUnits  = 30000                 // goSpanHot, in each hot-request
	childHotUnits = 9000                  // goChildHot, in each hot-child
	idleSleep     = 50 * time.Millisecond // each idle-request
)

func main() {
	server := flag.String("server", "", "push target base URL, e.g. http://127.0.0.1:4040 (required)")
	otlp := flag.String("otlp", "", "OTLP gRPC endpoint host:port, plaintext (required)")
	app := flag.String("app", "gotrace", "application name (pyroscope service_name and OTel service.name)")
	uploadRate := flag.Duration("upload-rate", time.Second, "how often profiles are pushed")
	duration := flag.Duration("duration", 6*time.Second, "how long to run")
	spansOut := flag.String("spans-out", "", "file that receives one line per exported span (required)")
	flag.Parse()

	if u, err := url.Parse(*server); err != nil || u.Host == "" {
		log.Fatalf("gotrace: -server %q must be a base URL like http://127.0.0.1:4040", *server)
	}
	if *otlp == "" || strings.Contains(*otlp, "/") {
		log.Fatalf("gotrace: -otlp %q must be host:port", *otlp)
	}
	if *spansOut == "" {
		log.Fatalf("gotrace: -spans-out is required")
	}
	out, err := os.OpenFile(*spansOut, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		log.Fatalf("gotrace: %v", err)
	}

	profiler, err := pyroscope.Start(pyroscope.Config{
		ApplicationName: *app,
		ServerAddress:   *server,
		UploadRate:      *uploadRate,
		Logger:          stderrLogger{},
		ProfileTypes:    []pyroscope.ProfileType{pyroscope.ProfileCPU},
	})
	if err != nil {
		log.Fatalf("gotrace: start profiler: %v", err)
	}

	// Errors the SDK reports besides ours (e.g. a dropped batch).
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		fmt.Fprintf(os.Stderr, "gotrace: otel: %v\n", err)
	}))
	ctx := context.Background()
	// Short timeout and retries: an unreachable endpoint must not hold the
	// exit for the default minute of retries.
	inner, err := otlptracegrpc.New(ctx,
		otlptracegrpc.WithEndpoint(*otlp),
		otlptracegrpc.WithInsecure(),
		otlptracegrpc.WithTimeout(3*time.Second),
		otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{
			Enabled:         true,
			InitialInterval: 100 * time.Millisecond,
			MaxInterval:     500 * time.Millisecond,
			MaxElapsedTime:  2 * time.Second,
		}),
	)
	if err != nil {
		log.Fatalf("gotrace: OTLP exporter: %v", err)
	}
	sdkProvider := sdktrace.NewTracerProvider(
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", *app))),
		sdktrace.WithSpanProcessor(sdktrace.NewBatchSpanProcessor(
			&recordingExporter{inner: inner, out: out},
			sdktrace.WithBatchTimeout(200*time.Millisecond),
		)),
	)
	// otel-profiling-go v0.5.3 on purpose: v0.5.x labels samples with span_id
	// and span_name only, no trace_id (v0.6.0 added it), the convention most
	// deployed services still send. Its defaults are what we want and cannot
	// be changed: both labels name the local ROOT span (samples taken in
	// hot-child carry hot-request's span_id and span_name). It has no public
	// option that does anything: the scope options are unexported and
	// WithAddSpanName, WithRootSpanOnly, WithAppName, WithProfileURL... are
	// deprecated no-ops, so none is passed.
	tracer := otelpyroscope.NewTracerProvider(sdkProvider).Tracer("proflow.test/peers/apps/gotrace")

	for end := time.Now().Add(*duration); time.Now().Before(end); {
		hotRequest(tracer)
		idleRequest(tracer)
	}

	flushCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := sdkProvider.ForceFlush(flushCtx); err != nil {
		fmt.Fprintf(os.Stderr, "gotrace: flush spans: %v\n", err)
	}
	if err := sdkProvider.Shutdown(flushCtx); err != nil {
		fmt.Fprintf(os.Stderr, "gotrace: shut down tracer provider: %v\n", err)
	}
	if err := out.Close(); err != nil {
		log.Fatalf("gotrace: %v", err)
	}
	if err := profiler.Stop(); err != nil {
		log.Fatalf("gotrace: stop profiler: %v", err)
	}
}

// hotRequest is one trace: root span hot-request (goSpanHot) with child span
// hot-child (goChildHot).
func hotRequest(tracer trace.Tracer) {
	ctx, root := tracer.Start(context.Background(), "hot-request", trace.WithNewRoot())
	goSpanHot(spanHotUnits)
	_, child := tracer.Start(ctx, "hot-child")
	goChildHot(childHotUnits)
	child.End()
	root.End()
}

// idleRequest is one trace: root span idle-request, sleeping.
func idleRequest(tracer trace.Tracer) {
	_, span := tracer.Start(context.Background(), "idle-request", trace.WithNewRoot())
	time.Sleep(idleSleep)
	span.End()
}

var sink uint64

//go:noinline
func goSpanHot(units int) { burn(units) }

//go:noinline
func goChildHot(units int) { burn(units) }

// burn does units of a thousand dependent multiply-adds. Whether or not the
// compiler inlines it, every sample taken inside it has goSpanHot or
// goChildHot (never inlined) on its stack.
func burn(units int) {
	x := sink
	for u := 0; u < units; u++ {
		for i := 0; i < 1000; i++ {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	sink = x
}

// recordingExporter passes spans to the OTLP exporter and, once it accepted
// them, writes one line per span to out: the spans the SDK exported.
type recordingExporter struct {
	inner sdktrace.SpanExporter
	mu    sync.Mutex
	out   *os.File
}

func (e *recordingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if err := e.inner.ExportSpans(ctx, spans); err != nil {
		fmt.Fprintf(os.Stderr, "gotrace: export failed: %v\n", err)
		return err
	}
	var b strings.Builder
	for _, s := range spans {
		sc, parent := s.SpanContext(), ""
		if s.Parent().HasSpanID() {
			parent = s.Parent().SpanID().String()
		}
		fmt.Fprintf(&b, "trace_id=%s span_id=%s parent_span_id=%s name=%s start_unix_nano=%d end_unix_nano=%d\n",
			sc.TraceID(), sc.SpanID(), parent, s.Name(), s.StartTime().UnixNano(), s.EndTime().UnixNano())
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := e.out.WriteString(b.String()); err != nil {
		fmt.Fprintf(os.Stderr, "gotrace: write -spans-out: %v\n", err)
		return errors.Join(errors.New("spans exported but not recorded"), err)
	}
	return nil
}

func (e *recordingExporter) Shutdown(ctx context.Context) error { return e.inner.Shutdown(ctx) }

// stderrLogger shows the client's errors (a failed upload is what a test wants
// to see) and drops its debug chatter.
type stderrLogger struct{}

func (stderrLogger) Infof(format string, args ...interface{})  {}
func (stderrLogger) Debugf(format string, args ...interface{}) {}
func (stderrLogger) Errorf(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "gotrace: "+format+"\n", args...)
}
