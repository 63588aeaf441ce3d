package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
)

// ScopeFunc returns the authenticated caller of r (for example the user id
// that an authentication middleware stored in r's context). It reports false
// when r is not authenticated; the middleware then refuses the request and
// never falls back to a shared namespace.
//
// The middleware calls it only for requests with at most one Authorization
// header field: a request with two is refused with 400
// (authorization-repeated) first, because a proxy that reads the last field
// and a ScopeFunc that reads the first would disagree about who the caller is.
type ScopeFunc func(r *http.Request) (scope string, ok bool)

// MiddlewareConfig tunes [Guard.Middleware]. A nil *MiddlewareConfig is
// valid: every default. A zero field takes its default; a negative MaxBody
// makes Middleware panic, naming it.
type MiddlewareConfig struct {
	// OptionalKey lets requests without an Idempotency-Key header through,
	// unguarded. Defaults to false: a missing key is refused with 400.
	OptionalKey bool
	// MaxBody bounds the bodies the middleware holds: a request body is
	// read and fingerprinted up to it (a larger request gets 413 and the
	// handler is not called), and an answer body larger than it is
	// delivered but not stored (see Middleware). Defaults to DefaultMaxBody
	// (1 MiB).
	MaxBody int64
	// StoredHeaders is the allowlist of response headers that are stored and
	// replayed; an empty non-nil list stores none. Set-Cookie,
	// Authorization, Content-Length and hop-by-hop headers are never
	// stored, even when listed. Defaults to the ones a client acts on
	// (Location, Content-Type, Content-Language, Content-Encoding,
	// Content-Location, ETag, Last-Modified) and Cache-Control, so that a
	// replayed answer keeps its caching rules (a replayed 402 problem stays
	// "no-store").
	StoredHeaders []string
	// Fingerprint replaces how requests are fingerprinted from the request
	// and its body (read in full, at most MaxBody), for example to leave
	// out a tracking query parameter that clients change between retries.
	// A retry must get the same fingerprint as the first request, and a
	// different request under the same key a different one. Defaults to
	// HashRequest over the method, the request target (path and query) and
	// the body.
	//
	// WARNING: whatever the function leaves out may differ between a first
	// request and a retry that is then replayed the first answer: leave out
	// only what does not change the intent.
	Fingerprint func(r *http.Request, body []byte) Fingerprint
	// RenderProblem replaces how refusals are written; it must write a
	// complete response. It may change the problem's Type (the default is
	// ProblemBase and the slug) or add headers, such as the WWW-Authenticate
	// challenge RFC 9110 asks of a 401. Defaults to [Problem.Write].
	RenderProblem func(w http.ResponseWriter, r *http.Request, p Problem)
}

// defaultStoredHeaders is the default of MiddlewareConfig.StoredHeaders.
var defaultStoredHeaders = []string{
	"Location", "Content-Type", "Content-Language", "Content-Encoding",
	"Content-Location", "ETag", "Last-Modified", "Cache-Control",
}

// neverStored headers are dropped even when listed: credentials, cookies,
// per-connection framing.
var neverStored = map[string]bool{
	"Set-Cookie": true, "Set-Cookie2": true, "Authorization": true, "Proxy-Authorization": true,
	"Proxy-Authenticate": true, "Www-Authenticate": true, "Connection": true, "Keep-Alive": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Proxy-Connection": true, "Content-Length": true, HeaderReplayed: true,
}

// storedHeaders canonicalises an allowlist and drops what is never stored.
func storedHeaders(names []string) []string {
	stored := []string{}
	for _, n := range names {
		c := http.CanonicalHeaderKey(n)
		if !neverStored[c] {
			stored = append(stored, c)
		}
	}
	return stored
}

type middleware struct {
	g           *Guard
	scope       ScopeFunc
	next        http.Handler
	optional    bool
	maxBody     int64
	stored      []string
	render      func(w http.ResponseWriter, r *http.Request, p Problem)
	fingerprint func(r *http.Request, body []byte) Fingerprint
}

// newMiddleware applies cfg's defaults; it panics on a negative size.
func newMiddleware(g *Guard, scope ScopeFunc, cfg *MiddlewareConfig) middleware {
	var c MiddlewareConfig
	if cfg != nil {
		c = *cfg
	}
	if c.MaxBody < 0 {
		panic(fmt.Sprintf("idem: MiddlewareConfig.MaxBody must not be negative, got %d", c.MaxBody))
	}
	m := middleware{g: g, scope: scope, optional: c.OptionalKey, maxBody: c.MaxBody, render: c.RenderProblem, fingerprint: c.Fingerprint}
	if m.maxBody == 0 {
		m.maxBody = DefaultMaxBody
	}
	if c.StoredHeaders == nil {
		c.StoredHeaders = defaultStoredHeaders
	}
	m.stored = storedHeaders(c.StoredHeaders)
	if m.render == nil {
		m.render = func(w http.ResponseWriter, _ *http.Request, p Problem) { p.Write(w) }
	}
	return m
}

// Middleware returns net/http middleware (usable with http.ServeMux, chi and
// any router taking func(http.Handler) http.Handler) that guards requests
// with g.
//
// For each guarded request (POST and PATCH; other methods pass through) it parses the
// Idempotency-Key header (see ParseKey), asks scope for the caller, reads the
// body up to the limit and fingerprints method, target and body
// (HashRequest). The handler receives the body unchanged. The handler's
// answer is captured (status, body and the allowlisted headers), stored, and
// only then sent to the client, so that what a client reads is what every
// replay gets, and a slow reader cannot hold the key: it blocks in the send,
// after the answer is stored. When the key ends up holding another answer
// than the handler wrote (one completed through Complete), the stored one is
// sent. A retry is answered with the stored status, headers and body, byte
// for byte, plus "Idempotent-Replayed: true".
//
// Refusals are RFC 9457 problems: 400 for a missing or invalid key, a
// repeated Authorization header or an unreadable body, 401 without a caller,
// 413 for an oversized body, 409 with Retry-After while in progress
// (request-in-progress) or pending reconciliation (request-pending), 422 for
// a reused key, 503 with Retry-After when the store is unavailable (see
// Decision.RetryAfter). A retry of a running key waits for its answer when
// the Guard's Config.Wait says so. Internal error text goes to the Guard's
// logger, never to the client.
//
// Middleware panics if scope is nil or cfg's MaxBody is negative.
//
// WARNING: an answer that the handler flushes (streams), hijacks, or that is
// larger than the response limit is sent as it is produced and not stored.
// Its key stays in progress, exactly like a 5xx: retries get 409 until the key
// is settled or released. Do not guard streaming endpoints.
func (g *Guard) Middleware(scope ScopeFunc, cfg *MiddlewareConfig) func(http.Handler) http.Handler {
	if scope == nil {
		panic("idem: Middleware needs a ScopeFunc")
	}
	base := newMiddleware(g, scope, cfg)
	return func(next http.Handler) http.Handler {
		m := base
		m.next = next
		return &m
	}
}

// problem writes a refusal of the middleware's own: one that Classify does
// not cover (a repeated Authorization header, an unreadable body).
func (m *middleware) problem(w http.ResponseWriter, r *http.Request, status int, slug, detail string) {
	m.render(w, r, Problem{Type: ProblemBase + slug, Title: problemTitles[slug], Status: status, Detail: detail, Slug: slug})
}

// refuse writes the refusal that Classify makes of outcome and err (never
// an answered one: the handler did not run): its status, type and
// Retry-After, with a detail worded for HTTP. A refusal with a 5xx status
// logs err.
func (m *middleware) refuse(w http.ResponseWriter, r *http.Request, outcome Outcome, err error) {
	d := Classify(outcome, err)
	p := Problem{
		Type: ProblemBase + d.Slug, Title: problemTitles[d.Slug], Status: d.Status, Detail: httpDetails[d.Slug],
		Slug: d.Slug, RetryAfter: d.RetryAfter, Err: err,
	}
	if ke := (*KeyError)(nil); d.Slug == ProblemKeyInvalid && errors.As(err, &ke) {
		p.Detail = "The Idempotency-Key header is invalid: " + ke.Reason + "."
	}
	if err != nil && p.Status >= 500 && !errors.Is(err, ErrUnavailable) { // the Guard logs those
		m.g.log.LogAttrs(r.Context(), slog.LevelError, "idem: request refused",
			slog.Int("status", p.Status), slog.String("problem", d.Slug), slog.Any("error", err))
	}
	m.render(w, r, p)
}

// httpDetails are the details of the refusals Classify makes, worded for a
// client of the middleware.
var httpDetails = map[string]string{
	ProblemKeyMissing:         "Send an Idempotency-Key header with a unique value (e.g. a UUID) per intent.",
	ProblemKeyInvalid:         "The Idempotency-Key header is invalid.",
	ProblemKeyReused:          "This Idempotency-Key was used with a different request. Use a new key for a new intent.",
	ProblemInProgress:         "A request with this Idempotency-Key is being processed. Retry shortly with the same key.",
	ProblemPending:            "The outcome of the request with this Idempotency-Key is not known yet; it is being reconciled. Retry later with the same key.",
	ProblemUnauthenticated:    "This request needs an authenticated caller.",
	ProblemServiceUnavailable: "The request was not processed. Retry later with the same Idempotency-Key.",
}

func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost && r.Method != http.MethodPatch {
		m.next.ServeHTTP(w, r)
		return
	}
	values := r.Header.Values(HeaderKey)
	if len(values) == 0 && m.optional {
		m.next.ServeHTTP(w, r)
		return
	}
	if len(r.Header.Values("Authorization")) > 1 {
		m.problem(w, r, http.StatusBadRequest, ProblemAuthorizationRepeated, "Send exactly one Authorization header.")
		return
	}
	scope, ok := m.scope(r)
	if !ok || scope == "" {
		m.refuse(w, r, OutcomeNone, &RequestError{Field: "Scope", Reason: "no authenticated caller"})
		return
	}
	key, err := ParseKey(values)
	if err != nil {
		if errors.Is(err, ErrKeyMissing) {
			m.g.tel.add(r.Context(), evKeyMissing)
		} else {
			m.g.tel.add(r.Context(), evKeyInvalid)
		}
		m.refuse(w, r, OutcomeNone, err)
		return
	}
	body, status := m.readBody(r)
	if status != 0 {
		if status == http.StatusRequestEntityTooLarge {
			m.problem(w, r, status, ProblemBodyTooLarge, fmt.Sprintf("The request body is larger than %d bytes.", m.maxBody))
		} else {
			m.problem(w, r, status, ProblemBodyInvalid, "The request body could not be read completely.")
		}
		return
	}
	var fp Fingerprint
	if m.fingerprint != nil {
		fp = m.fingerprint(r, body)
	} else {
		fp = HashRequest(r.Method, r.URL.RequestURI(), body)
	}
	req := Request{Scope: scope, Key: key, Fingerprint: fp}

	var rec *recorder
	resp, out, err := m.g.Do(r.Context(), req, func(ctx context.Context) (Response, error) {
		if x := executionFrom(ctx); x != nil {
			x.stored = m.stored // Complete stores only the allowlisted headers
		}
		c := &struct {
			rec  recorder
			body bodyReader
		}{rec: recorder{w: w, allow: m.stored, max: m.maxBody}}
		rec = &c.rec
		c.body.Reset(body)
		r2 := r.WithContext(ctx)
		r2.Body = &c.body
		r2.ContentLength = int64(len(body))
		m.next.ServeHTTP(rec, r2)
		return rec.result()
	})
	switch out {
	case OutcomeExecuted, OutcomeExecutedUnstored, OutcomeExecutedReleased:
		// The answer is stored (or known not to be): now the client gets
		// it. What was stored wins over what the handler wrote.
		var stored Response
		if out == OutcomeExecuted && !resp.Equal(rec.captured()) {
			stored = resp
		}
		rec.send(stored)
		if errors.Is(err, errNotStorable) {
			m.g.log.LogAttrs(r.Context(), slog.LevelWarn, "idem: answer delivered but not stored (streamed, hijacked or too large); key left in progress",
				slog.String("key_hash", keyHash(req)))
		}
	case OutcomeReplayed:
		writeReplay(w, resp)
	default: // refused: the handler did not run
		var re *RequestError
		if errors.As(err, &re) && re.Field == "Scope" {
			// The ScopeFunc returned an identity the guard cannot key on
			// (too long, not UTF-8): the caller is not usable.
			m.g.log.LogAttrs(r.Context(), slog.LevelWarn, "idem: ScopeFunc returned an unusable scope",
				slog.String("reason", re.Reason))
		}
		m.refuse(w, r, out, err)
	}
}

// readBody reads the whole body up to the limit. A non-zero status means the
// request must be refused.
//
// The buffer grows with the bytes that arrive, never from the declared
// Content-Length alone: a client that sends headers declaring a large body
// and then nothing holds at most firstBodyBuffer bytes, not the limit.
func (m *middleware) readBody(r *http.Request) ([]byte, int) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, 0
	}
	if r.ContentLength > m.maxBody {
		return nil, http.StatusRequestEntityTooLarge
	}
	limit := m.maxBody + 1 // one byte more than allowed: see an oversized body
	if r.ContentLength >= 0 && r.ContentLength+1 < limit {
		limit = r.ContentLength + 1 // +1: see EOF without growing
	}
	var buf []byte
	for {
		if len(buf) == cap(buf) {
			buf = growBody(buf, limit)
		}
		n, err := r.Body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > m.maxBody {
			return nil, http.StatusRequestEntityTooLarge
		}
		if err == io.EOF {
			return buf, 0
		}
		if err != nil {
			return nil, http.StatusBadRequest
		}
	}
}

// firstBodyBuffer is the largest first buffer of a request body: one
// allocation for a typical checkout body, and all that a client declaring a
// large body and sending nothing can hold.
const firstBodyBuffer = 4 << 10

// growBody returns buf with more room: twice its capacity (firstBodyBuffer
// at first), at most limit, unless buf is already that large; a body longer
// than it declared (never from net/http) then grows past it and meets the
// size check.
func growBody(buf []byte, limit int64) []byte {
	c := int64(2 * cap(buf))
	if c < firstBodyBuffer {
		c = firstBodyBuffer
	}
	if c > limit && int64(cap(buf)) < limit {
		c = limit
	}
	grown := make([]byte, len(buf), c)
	copy(grown, buf)
	return grown
}

// bodyReader hands the handler the body that was read, in one allocation.
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }

func writeReplay(w http.ResponseWriter, resp Response) {
	w.Header().Set(HeaderReplayed, "true")
	resp.Write(w)
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}
