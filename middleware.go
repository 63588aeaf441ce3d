package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemguard/idem/durable"
)

// ScopeFunc returns the authenticated caller of r (for example the user id
// that an authentication middleware stored in r's context). It reports false
// when r is not authenticated; the middleware then refuses the request and
// never falls back to a shared namespace.
type ScopeFunc func(r *http.Request) (scope string, ok bool)

// Option configures the middleware.
type Option func(*middleware)

// Middleware defaults.
const (
	DefaultMaxRequestBody  = 1 << 20 // 1 MiB
	DefaultMaxResponseBody = 1 << 20 // 1 MiB
)

// DefaultStoredHeaders returns the response headers stored and replayed
// unless WithStoredHeaders says otherwise: the ones a client acts on
// (Location, Content-Type, Content-Language, Content-Encoding,
// Content-Location, ETag, Last-Modified) and Cache-Control, so that a replayed
// answer keeps its caching rules (a replayed 402 problem stays "no-store").
// Each call returns a new slice.
func DefaultStoredHeaders() []string {
	return []string{
		"Location", "Content-Type", "Content-Language", "Content-Encoding",
		"Content-Location", "ETag", "Last-Modified", "Cache-Control",
	}
}

// neverStored headers are dropped even when listed: credentials, cookies,
// per-connection framing.
var neverStored = map[string]bool{
	"Set-Cookie": true, "Set-Cookie2": true, "Authorization": true, "Proxy-Authorization": true,
	"Proxy-Authenticate": true, "Www-Authenticate": true, "Connection": true, "Keep-Alive": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Proxy-Connection": true, "Content-Length": true, HeaderReplayed: true,
}

// WithMethods sets the methods that are guarded; others pass through
// untouched. Defaults to POST and PATCH.
func WithMethods(methods ...string) Option {
	return func(m *middleware) {
		m.methods = map[string]bool{}
		for _, x := range methods {
			m.methods[x] = true
		}
	}
}

// WithOptionalKey lets requests without an Idempotency-Key header through,
// unguarded. By default a missing key is refused with 400.
func WithOptionalKey() Option { return func(m *middleware) { m.optional = true } }

// WithMaxRequestBody sets how many body bytes are read and fingerprinted;
// larger requests get 413 and the handler is not called. Defaults to 1 MiB.
func WithMaxRequestBody(n int64) Option { return func(m *middleware) { m.maxBody = n } }

// WithMaxResponseBody sets the largest answer body that is stored. A larger
// answer is delivered but not stored: see Middleware. Defaults to 1 MiB.
func WithMaxResponseBody(n int) Option { return func(m *middleware) { m.maxResp = n } }

// WithStoredHeaders replaces the allowlist of response headers that are stored
// and replayed. Set-Cookie, Authorization, Content-Length and hop-by-hop
// headers are never stored, even when listed. Defaults to
// DefaultStoredHeaders().
func WithStoredHeaders(names ...string) Option {
	return func(m *middleware) {
		m.stored = m.stored[:0:0]
		for _, n := range names {
			c := http.CanonicalHeaderKey(n)
			if !neverStored[c] {
				m.stored = append(m.stored, c)
			}
		}
	}
}

// RetryHints are the Retry-After values the middleware sends with its 409
// and 503 problems, rounded up to whole seconds. A zero field takes its
// default; a negative one sends no Retry-After.
type RetryHints struct {
	// InProgress: a request with the key is running now; its answer is
	// typically a work's duration away. Defaults to 1s.
	InProgress time.Duration
	// Pending: the key's work ended without a known outcome and waits for
	// reconciliation (ErrPending), typically the reconciler's MinAge plus
	// an interval away. Defaults to 30s.
	Pending time.Duration
	// Unavailable: the store could not decide (503); nothing ran.
	// Defaults to 2s.
	Unavailable time.Duration
}

// Default Retry-After values.
const (
	DefaultRetryInProgress  = time.Second
	DefaultRetryPending     = 30 * time.Second
	DefaultRetryUnavailable = 2 * time.Second
)

func (h RetryHints) withDefaults() RetryHints {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&h.InProgress, DefaultRetryInProgress)
	def(&h.Pending, DefaultRetryPending)
	def(&h.Unavailable, DefaultRetryUnavailable)
	return h
}

// WithRetryHints sets the Retry-After of 409 and 503 problems. Defaults to
// 1s while in progress, 30s while pending reconciliation, 2s when
// unavailable. Match Pending to your reconciler's cadence.
func WithRetryHints(h RetryHints) Option { return func(m *middleware) { m.retry = h.withDefaults() } }

// FingerprintFunc computes the fingerprint of a guarded request from the
// request and its body (read in full, at most the body limit). A retry must
// get the same fingerprint as the first request, and a different request
// under the same key a different one.
type FingerprintFunc func(r *http.Request, body []byte) Fingerprint

// WithFingerprint replaces how requests are fingerprinted, for example to
// leave out a tracking query parameter that clients change between retries.
// Defaults to HashRequest over the method, the request target (path and
// query) and the body.
//
// WARNING: whatever the function leaves out may differ between a first
// request and a retry that is then replayed the first answer: leave out only
// what does not change the intent.
func WithFingerprint(fn FingerprintFunc) Option { return func(m *middleware) { m.fingerprint = fn } }

// WithWait lets a retry that finds its key in progress wait up to d for the
// running request's answer and replay it, instead of being refused with 409
// (see WaitFor; the Guard needs a Config.Waiter). Keep d below the client's
// own timeout. Defaults to 0: no waiting.
func WithWait(d time.Duration) Option { return func(m *middleware) { m.wait = d } }

// WithProblemBase sets the URI that problem type slugs are appended to.
// Defaults to DefaultProblemBase.
func WithProblemBase(base string) Option { return func(m *middleware) { m.base = base } }

// WithProblemRenderer replaces how problems are written. Defaults to
// RenderProblem.
func WithProblemRenderer(fn ProblemRenderer) Option { return func(m *middleware) { m.render = fn } }

// WithUnauthenticatedStatus sets the status sent when the ScopeFunc finds no
// caller. Defaults to 401.
func WithUnauthenticatedStatus(code int) Option { return func(m *middleware) { m.noScope = code } }

// WithChallenge sets the WWW-Authenticate challenge sent with a 401 problem,
// e.g. `Bearer realm="checkout"`; RFC 9110 requires one on every 401.
// Defaults to none.
func WithChallenge(challenge string) Option { return func(m *middleware) { m.challenge = challenge } }

type middleware struct {
	g           *Guard
	scope       ScopeFunc
	next        http.Handler
	methods     map[string]bool
	optional    bool
	maxBody     int64
	maxResp     int
	stored      []string
	base        string
	render      ProblemRenderer
	noScope     int
	challenge   string
	retry       RetryHints
	fingerprint FingerprintFunc
	wait        time.Duration
	doOpts      []DoOption // built once from wait
}

// Middleware returns net/http middleware (usable with http.ServeMux, chi and
// any router taking func(http.Handler) http.Handler) that guards requests
// with g.
//
// For each guarded request (POST and PATCH by default) it parses the
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
// Refusals are RFC 9457 problems: 400 for a missing or invalid key or an
// unreadable body, 401 without a caller, 413 for an oversized body, 409 with
// Retry-After while in progress (request-in-progress) or pending
// reconciliation (request-pending), 422 for a reused key, 503 with
// Retry-After when the store is unavailable (see WithRetryHints). Internal error text goes to the Guard's logger, never to the
// client.
//
// WARNING: an answer that the handler flushes (streams), hijacks, or that is
// larger than the response limit is sent as it is produced and not stored.
// Its key stays in progress, exactly like a 5xx: retries get 409 until the key
// is settled or released. Do not guard streaming endpoints.
func (g *Guard) Middleware(scope ScopeFunc, opts ...Option) func(http.Handler) http.Handler {
	if scope == nil {
		panic("idem: Middleware needs a ScopeFunc")
	}
	base := middleware{
		g:       g,
		scope:   scope,
		methods: map[string]bool{http.MethodPost: true, http.MethodPatch: true},
		maxBody: DefaultMaxRequestBody,
		maxResp: DefaultMaxResponseBody,
		base:    DefaultProblemBase,
		render:  RenderProblem,
		noScope: http.StatusUnauthorized,
		retry:   RetryHints{}.withDefaults(),
	}
	WithStoredHeaders(DefaultStoredHeaders()...)(&base)
	for _, o := range opts {
		o(&base)
	}
	if base.wait > 0 {
		base.doOpts = []DoOption{WaitFor(base.wait)}
	}
	return func(next http.Handler) http.Handler {
		m := base
		m.next = next
		return &m
	}
}

func (m *middleware) problem(w http.ResponseWriter, r *http.Request, status int, slug, detail string, cause error) {
	p := Problem{
		Type: m.base + slug, Title: problemTitles[slug], Status: status, Detail: detail,
		Slug: slug, Err: cause,
	}
	switch slug {
	case ProblemInProgress:
		p.RetryAfter = m.retry.InProgress
	case ProblemPending:
		p.RetryAfter = m.retry.Pending
	case ProblemServiceUnavailable:
		p.RetryAfter = m.retry.Unavailable
	}
	if status == http.StatusUnauthorized && m.challenge != "" {
		w.Header().Set("WWW-Authenticate", m.challenge)
	}
	if cause != nil && status >= 500 {
		m.g.log.LogAttrs(r.Context(), slog.LevelError, "idem: request refused",
			slog.Int("status", status), slog.String("problem", slug), slog.Any("error", cause))
	}
	m.render(w, r, p)
}

func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !m.methods[r.Method] {
		m.next.ServeHTTP(w, r)
		return
	}
	values := r.Header.Values(HeaderKey)
	if len(values) == 0 && m.optional {
		m.next.ServeHTTP(w, r)
		return
	}
	scope, ok := m.scope(r)
	if !ok || scope == "" {
		m.problem(w, r, m.noScope, ProblemUnauthenticated, "This request needs an authenticated caller.", nil)
		return
	}
	key, err := ParseKey(values)
	if err != nil {
		if errors.Is(err, ErrKeyMissing) {
			m.g.tel.add(r.Context(), evKeyMissing)
			m.problem(w, r, http.StatusBadRequest, ProblemKeyMissing,
				"Send an Idempotency-Key header with a unique value (e.g. a UUID) per intent.", nil)
			return
		}
		m.g.tel.add(r.Context(), evKeyInvalid)
		var ke *KeyError
		detail := "The Idempotency-Key header is invalid."
		if errors.As(err, &ke) {
			detail = "The Idempotency-Key header is invalid: " + ke.Reason + "."
		}
		m.problem(w, r, http.StatusBadRequest, ProblemKeyInvalid, detail, nil)
		return
	}
	body, status := m.readBody(r)
	if status != 0 {
		if status == http.StatusRequestEntityTooLarge {
			m.problem(w, r, status, ProblemBodyTooLarge,
				fmt.Sprintf("The request body is larger than %d bytes.", m.maxBody), nil)
		} else {
			m.problem(w, r, status, ProblemBodyInvalid, "The request body could not be read completely.", nil)
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
		}{rec: recorder{w: w, allow: m.stored, max: m.maxResp}}
		rec = &c.rec
		c.body.Reset(body)
		r2 := r.WithContext(ctx)
		r2.Body = &c.body
		r2.ContentLength = int64(len(body))
		m.next.ServeHTTP(rec, r2)
		return rec.result()
	}, m.doOpts...)
	switch out {
	case OutcomeExecuted, OutcomeExecutedPending, OutcomeExecutedReleased:
		// The answer is stored (or known not to be): now the client gets
		// it. What was stored wins over what the handler wrote.
		var stored Response
		if out == OutcomeExecuted && !durable.Answer(resp).Equal(durable.Answer(rec.captured())) {
			stored = resp
		}
		rec.send(stored)
		if errors.Is(err, errNotStorable) {
			m.g.log.LogAttrs(r.Context(), slog.LevelWarn, "idem: answer delivered but not stored (streamed, hijacked or too large); key left in progress",
				slog.String("key_hash", keyHash(req)))
		}
	case OutcomeReplayed:
		writeReplay(w, resp)
	case OutcomeInProgress:
		if errors.Is(err, ErrPending) {
			m.problem(w, r, http.StatusConflict, ProblemPending,
				"The outcome of the request with this Idempotency-Key is not known yet; it is being reconciled. Retry later with the same key.", nil)
			return
		}
		m.problem(w, r, http.StatusConflict, ProblemInProgress,
			"A request with this Idempotency-Key is being processed. Retry shortly with the same key.", nil)
	case OutcomeKeyReused:
		m.problem(w, r, http.StatusUnprocessableEntity, ProblemKeyReused,
			"This Idempotency-Key was used with a different request. Use a new key for a new intent.", nil)
	default:
		var re *RequestError
		if errors.As(err, &re) {
			if re.Field == "Scope" {
				// The ScopeFunc returned an identity the guard cannot key on
				// (too long, not UTF-8): the caller is not usable.
				m.g.log.LogAttrs(r.Context(), slog.LevelWarn, "idem: ScopeFunc returned an unusable scope",
					slog.String("reason", re.Reason))
				m.problem(w, r, m.noScope, ProblemUnauthenticated, "This request needs an authenticated caller.", nil)
				return
			}
			m.problem(w, r, http.StatusBadRequest, ProblemKeyInvalid, "The Idempotency-Key header is invalid.", err)
			return
		}
		m.problem(w, r, http.StatusServiceUnavailable, ProblemServiceUnavailable,
			"The request was not processed. Retry later with the same Idempotency-Key.", err)
	}
}

// readBody reads the whole body up to the limit. A non-zero status means the
// request must be refused.
func (m *middleware) readBody(r *http.Request) ([]byte, int) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, 0
	}
	if r.ContentLength > m.maxBody {
		return nil, http.StatusRequestEntityTooLarge
	}
	size := int64(512)
	if r.ContentLength > 0 {
		size = r.ContentLength + 1 // +1: see EOF without growing
	}
	buf := make([]byte, 0, size)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
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

// bodyReader hands the handler the body that was read, in one allocation.
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }

func writeReplay(w http.ResponseWriter, resp Response) {
	w.Header().Set(HeaderReplayed, "true")
	WriteResponse(w, resp)
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}
