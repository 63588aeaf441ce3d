package idem_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/idemtest"
)

func spanAttrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func spanEvents(s sdktrace.ReadOnlySpan) []string {
	var names []string
	for _, e := range s.Events() {
		names = append(names, e.Name)
	}
	return names
}

// One execution and three replays give four spans, the three replays linked
// to the execution's span.
func TestTraceReplayLinksToExecution(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	g, err := idem.New(idemtest.NewMemStore(nil), &idem.Config{TracerProvider: tp})
	require.NoError(t, err)

	ctx := context.Background()
	w := &counter{resp: created("o1")}
	r := req("user-1", newKey(), `{"hold_ids":[1]}`)
	_, out, err := g.Do(ctx, r, w.work)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out)
	for range 3 {
		_, out, err = g.Do(ctx, r, w.work)
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeReplayed, out)
	}

	spans := rec.Ended()
	require.Len(t, spans, 4)
	exec := spans[0]
	a := spanAttrs(exec)
	require.Equal(t, "executed", a["idem.outcome"].AsString())
	require.Equal(t, "table", a["idem.strategy"].AsString())
	require.EqualValues(t, 1, a["idem.attempt"].AsInt64())
	require.Equal(t, idem.KeyHash(r.Scope, r.Key), a["idem.key_hash"].AsString())
	for _, kv := range exec.Attributes() {
		require.NotContains(t, kv.Value.String(), r.Key, "the raw key must never reach a span")
	}
	require.Equal(t, []string{"claim", "store"}, spanEvents(exec))
	require.Empty(t, exec.Links())

	for _, s := range spans[1:] {
		a := spanAttrs(s)
		require.Equal(t, "replayed", a["idem.outcome"].AsString())
		require.Equal(t, idem.KeyHash(r.Scope, r.Key), a["idem.key_hash"].AsString())
		require.EqualValues(t, 1, a["idem.attempt"].AsInt64())
		require.Len(t, s.Links(), 1)
		require.Equal(t, exec.SpanContext(), s.Links()[0].SpanContext)
		require.NotEqual(t, exec.SpanContext().SpanID(), s.SpanContext().SpanID())
	}
}

// The work runs inside the request's span: its own spans are children.
func TestTraceWorkIsAChild(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	g, err := idem.New(idemtest.NewMemStore(nil), &idem.Config{TracerProvider: tp})
	require.NoError(t, err)
	_, _, err = g.Do(context.Background(), req("u", newKey(), "{}"), func(ctx context.Context) (idem.Response, error) {
		_, s := tp.Tracer("work").Start(ctx, "charge")
		s.End()
		return created("o2"), nil
	})
	require.NoError(t, err)
	spans := rec.Ended()
	require.Len(t, spans, 2)
	require.Equal(t, "charge", spans[0].Name())
	require.Equal(t, spans[1].SpanContext().SpanID(), spans[0].Parent().SpanID())
}

// Without a TracerProvider, Do allocates no more than with tracing compiled
// out: the only cost is a nil check.
func TestTraceOffCostsNothing(t *testing.T) {
	g, err := idem.New(idemtest.NewMemStore(nil), nil)
	require.NoError(t, err)
	ctx := context.Background()
	r := req("u", newKey(), "{}")
	w := &counter{resp: created("o3")}
	_, _, err = g.Do(ctx, r, w.work)
	require.NoError(t, err)
	off := testing.AllocsPerRun(200, func() { _, _, _ = g.Do(ctx, r, w.work) })

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	gt, err := idem.New(idemtest.NewMemStore(nil), &idem.Config{TracerProvider: tp})
	require.NoError(t, err)
	_, _, err = gt.Do(ctx, r, w.work)
	require.NoError(t, err)
	on := testing.AllocsPerRun(200, func() { _, _, _ = gt.Do(ctx, r, w.work) })
	require.Greater(t, on, off, "tracing should cost allocations only when on")
	t.Logf("allocs per replay: off %.0f, on %.0f", off, on)
}

// Against PostgreSQL, in every strategy: four spans, the replays linked to
// the execution, and the hybrid's lease steps as events.
func TestTraceStrategies(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		b := setup(t, strategy, func(o *setupOpts) { o.cfg.TracerProvider = tp })
		ctx := context.Background()
		w := &counter{resp: created("o1")}
		r := req("user-1", newKey(), `{"hold_ids":[1]}`)
		for i := range 4 {
			_, out, err := b.guard.Do(ctx, r, w.work)
			require.NoError(t, err)
			if i == 0 {
				require.Equal(t, idem.OutcomeExecuted, out)
			} else {
				require.Equal(t, idem.OutcomeReplayed, out)
			}
		}
		spans := rec.Ended()
		require.Len(t, spans, 4)
		exec := spans[0]
		wantStrategy := "table"
		switch strategy {
		case "hybrid-claim-first":
			wantStrategy = "hybrid"
			require.Equal(t, []string{"claim", "store", "lease_queued"}, spanEvents(exec))
		case "hybrid", "hybrid-miniredis":
			wantStrategy = "hybrid"
			require.Subset(t, spanEvents(exec), []string{"lock", "claim", "store", "lease_queued"})
		default:
			require.Equal(t, []string{"claim", "store"}, spanEvents(exec))
		}
		a := spanAttrs(exec)
		require.Equal(t, wantStrategy, a["idem.strategy"].AsString())
		require.Equal(t, "executed", a["idem.outcome"].AsString())
		require.EqualValues(t, 1, a["idem.attempt"].AsInt64())
		for _, s := range spans[1:] {
			require.Equal(t, "replayed", spanAttrs(s)["idem.outcome"].AsString())
			require.Len(t, s.Links(), 1)
			require.Equal(t, exec.SpanContext(), s.Links()[0].SpanContext)
		}
	})
}
