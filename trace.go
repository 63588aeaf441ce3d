package idem

import (
	"container/list"
	"context"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// tracing holds the Guard's tracer when Config.TracerProvider is set, and
// the span contexts of recent executions, so that a replay's span can link
// to the span of the execution whose answer it replays. A nil *tracing
// (no provider) starts no span and costs one nil check per request.
type tracing struct {
	tracer trace.Tracer
	strat  attribute.KeyValue
	mu     sync.Mutex
	ll     *list.List // front = most recently stored
	items  map[string]*list.Element
}

// maxTraceLinks bounds how many executions' span contexts a Guard keeps.
const maxTraceLinks = 4096

type traceLink struct {
	hash string
	sc   trace.SpanContext
}

func newTracing(tp trace.TracerProvider, strategy string) *tracing {
	if tp == nil {
		return nil
	}
	return &tracing{
		tracer: tp.Tracer("github.com/idemguard/idem"),
		strat:  attribute.String("idem.strategy", strategy),
		ll:     list.New(),
		items:  make(map[string]*list.Element),
	}
}

// start opens the span of one guarded request.
func (t *tracing) start(ctx context.Context, req Request) (context.Context, trace.Span, string) {
	h := keyHash(req)
	ctx, span := t.tracer.Start(ctx, "idem.request", trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(t.strat, attribute.String("idem.key_hash", h)))
	return ctx, span, h
}

// end records the outcome and, for a replay, the link to the execution.
func (t *tracing) end(span trace.Span, hash string, out Outcome, err error) {
	span.SetAttributes(attribute.String("idem.outcome", out.String()))
	if out == OutcomeReplayed {
		if sc, ok := t.link(hash); ok {
			span.AddLink(trace.Link{SpanContext: sc})
		}
	}
	if err != nil && out == OutcomeNone {
		span.RecordError(err)
	}
	span.End()
}

// executed remembers the span context of the execution that stored the
// answer of the key with this hash.
func (t *tracing) executed(ctx context.Context, hash string) {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if el, ok := t.items[hash]; ok {
		el.Value.(*traceLink).sc = sc
		t.ll.MoveToFront(el)
		return
	}
	t.items[hash] = t.ll.PushFront(&traceLink{hash: hash, sc: sc})
	for t.ll.Len() > maxTraceLinks {
		last := t.ll.Back()
		t.ll.Remove(last)
		delete(t.items, last.Value.(*traceLink).hash)
	}
}

func (t *tracing) link(hash string) (trace.SpanContext, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	el, ok := t.items[hash]
	if !ok {
		return trace.SpanContext{}, false
	}
	return el.Value.(*traceLink).sc, true
}

// attempt records which attempt of the key's intent the request claimed or
// found, when tracing.
func (t *tracing) attempt(ctx context.Context, n int) {
	if t != nil {
		trace.SpanFromContext(ctx).SetAttributes(attribute.Int("idem.attempt", n))
	}
}
